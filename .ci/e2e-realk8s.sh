#!/usr/bin/env bash
# Runs the end-to-end suite in its real-cluster mode against a real
# Kubernetes: ../shared/realk8s (kube-apiserver, controller-manager,
# scheduler and a kubelet with containerd and runc, v1.28.15), started here
# in a state directory of its own and stopped (and removed) at the end.
#
# The tests' pods run on the cluster's node from real images, loaded into
# containerd (no registry): the hostmesh image ($HOSTMESH_TEST_IMAGE, from
# image/build.sh) for the agent install container and the Helm chart's
# operator, the bundle's busybox for host pods, and the Monarch image
# (tests/images/monarch.sh) for Monarch's workers and clients. Operators the
# tests start themselves run on this machine and reach pods at their IPs.
#
# Two runs: the suite, tests side by side, each in its namespace with an
# operator for that namespace only; then the tests that need the cluster to
# themselves (a cluster-wide chart install with default values), with
# HOSTMESH_E2E_EXCLUSIVE=1. Measurements the tests record go to
# target/e2e-measurements.jsonl and are printed at the end.
#
# Usage: .ci/e2e-realk8s.sh [nextest args...]   (HOSTMESH_TEST_IMAGE set)
set -euo pipefail
cd "$(dirname "$0")/.."
: "${HOSTMESH_TEST_IMAGE:?set HOSTMESH_TEST_IMAGE to the image image/build.sh built}"

realk8s=$(cd ../shared/realk8s && pwd)
state=${REALK8S_STATE_DIR:-/tmp/hostmesh-ci-realk8s}
target_dir=${CARGO_TARGET_DIR:-target}
measurements="$(realpath -m "$target_dir")/e2e-measurements.jsonl"
cleanup() {
  local status=$?
  if [ "$status" -ne 0 ] && [ -d "$state/logs" ]; then
    for c in kube-apiserver kubelet containerd; do
      [ -f "$state/logs/$c.log" ] || continue
      echo "--- realk8s $c log (tail) ---" >&2
      tail -n 20 "$state/logs/$c.log" >&2
    done
  fi
  "$realk8s/down.sh" "$state" >/dev/null 2>&1 || true
  rm -rf "$state"
  exit "$status"
}
trap cleanup EXIT

start=$(date +%s)
up_out=$("$realk8s/up.sh" "$state")
eval "$(tail -n 1 <<<"$up_out")"
export KUBECONFIG
echo "ci: realk8s up in $(( $(date +%s) - start ))s ($(kubectl version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -n 1))"

start=$(date +%s)
"$realk8s/load-image.sh" "$HOSTMESH_TEST_IMAGE" "$state" >/dev/null
monarch_image=$(bash tests/images/monarch.sh | tail -n 1)
"$realk8s/load-image.sh" "$monarch_image" "$state" >/dev/null
echo "ci: images loaded into the node in $(( $(date +%s) - start ))s"

export HOSTMESH_E2E_NODES=cluster
export HOSTMESH_E2E_BUSYBOX_IMAGE=localhost/realk8s/busybox:1.35
export HOSTMESH_E2E_MONARCH_IMAGE="$monarch_image"
export HOSTMESH_E2E_MEASUREMENTS="$measurements"
rm -f "$measurements"

status=0
cargo nextest run --workspace -E 'package(hostmesh-e2e) & not test(/exclusive/)' "$@" || status=$?
HOSTMESH_E2E_EXCLUSIVE=1 cargo nextest run --workspace \
  -E 'package(hostmesh-e2e) & test(/exclusive/)' "$@" || status=$?

# Every test removed its namespace.
left=$(kubectl get namespaces -o name | grep -E '^namespace/e2e-' || true)
if [ -n "$left" ]; then
  echo "left behind on the cluster:" >&2
  echo "$left" >&2
  status=1
fi
if [ -f "$measurements" ]; then
  echo "ci: measurements on the real cluster:"
  cat "$measurements"
fi
exit "$status"
