#!/usr/bin/env bash
# Runs the end-to-end suite with a process kubelet joined to a cluster it
# did not start (KUBECONFIG set, HOSTMESH_E2E_NODES=process-kubelet;
# docs/testing.md): a separate `hostmesh apiserver` and
# `hostmesh controller-manager`, with no kubelet and no scheduler of their
# own. It exercises the process kubelet joining as a tainted Node, Worlds
# pinned to it, the operator running locally for the test's namespace only,
# and the cleanup of namespaces and Nodes the tests leave on a shared
# cluster. CI runs the suite on a real cluster's own nodes instead
# (.ci/e2e-realk8s.sh); this script is the way to try the joined mode.
#
# The Helm scenario is left out: the chart's operator pod would need a node
# of the cluster's own to run on.
#
# The tests are picked with a filter over `--workspace` rather than with `-p`:
# `-p hostmesh-e2e` resolves features for that package alone, which gives most
# workspace crates a different hash and builds them all a second time (twice
# the disk; a CI machine ran out of it and the linker died with SIGBUS).
#
# Usage: .ci/e2e-external-cluster.sh [nextest args...]  (after `cargo build --bin hostmesh`)
set -euo pipefail
cd "$(dirname "$0")/.."

bin=$(realpath "${HOSTMESH_BIN:-target/debug/hostmesh}")
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

"$bin" apiserver --listen 127.0.0.1:0 --kubeconfig "$dir/kubeconfig" >"$dir/apiserver.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 300); do
  [ -s "$dir/kubeconfig" ] && break
  sleep 0.1
done
if [ ! -s "$dir/kubeconfig" ]; then
  echo "the API server wrote no kubeconfig:" >&2
  cat "$dir/apiserver.log" >&2
  exit 1
fi
KUBECONFIG="$dir/kubeconfig" "$bin" controller-manager >"$dir/controller-manager.log" 2>&1 &
pids+=($!)

status=0
KUBECONFIG="$dir/kubeconfig" HOSTMESH_BIN="$bin" HOSTMESH_E2E_NODES=process-kubelet \
  cargo nextest run --workspace -E 'package(hostmesh-e2e) & not binary(helm)' "$@" || status=$?

# Every test removed its namespace and its Node.
left=$(KUBECONFIG="$dir/kubeconfig" kubectl get namespaces,nodes -o name | grep -E '^(namespace/e2e-|node/hostmesh-e2e-)' || true)
if [ -n "$left" ]; then
  echo "left behind on the cluster:" >&2
  echo "$left" >&2
  status=1
fi
if [ "$status" -ne 0 ]; then
  echo "--- apiserver log (tail) ---" >&2
  tail -n 30 "$dir/apiserver.log" >&2
fi
exit "$status"
