#!/usr/bin/env bash
# The actor-mesh example against the cluster KUBECONFIG names (one that
# runs the hostmesh operator: `hostmesh up` without --exit-when-ready, or
# the Helm chart): applies echo.yaml, runs the client
# (hostmesh-actors-example), then deletes what it applied. Exits 0 only
# when the client saw a reply from every rank and the event of the rank
# whose proc it ended; its last line says what it saw.
#
#   KUBECONFIG=.hostmesh/kubeconfig examples/actors/run.sh [NAMESPACE]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
ns="${1:-default}"
: "${KUBECONFIG:?set KUBECONFIG to a cluster running the hostmesh operator}"
kubectl apply -n "$ns" -f "$here/echo.yaml"
trap 'kubectl delete -n "$ns" -f "$here/echo.yaml" --ignore-not-found --wait=false >/dev/null 2>&1 || true' EXIT
cd "$here/../.."
cargo run --quiet -p hostmesh-actors-example -- "$ns" echo
