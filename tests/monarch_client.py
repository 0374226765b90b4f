"""A Monarch program, written as Monarch's docs show it: attach to the
workers of a mesh on Kubernetes with `KubernetesJob` defaults, spawn procs
on every host, an actor on every proc, call an endpoint on all of them and
on one slice. Nothing in it knows about hostmesh.

    python monarch_client.py NAMESPACE MESH HOSTS [KUBECONFIG]

In a pod it uses the in-cluster configuration; with KUBECONFIG (outside the
cluster) Monarch reaches rank 0 through `kubectl port-forward` itself.

After the first round it prints `ROUND1 OK` and, with CLIENT_ONCE=1 in its
environment, exits 0. Otherwise it keeps calling every actor (each call
bounded by CALL_TIMEOUT) until a call fails, then prints
`CALL FAILED: <error>` and exits 0; it exits 1 if no call failed within
WATCH_SECONDS. The e2e test kills a worker in between.
"""

import os
import socket
import sys
import time

from monarch.actor import Actor, current_rank, endpoint
from monarch.job.kubernetes import KubeConfig, KubernetesJob

CALL_TIMEOUT = 30
WATCH_SECONDS = 120


class Greeter(Actor):
    @endpoint
    def hello(self) -> str:
        return f"{socket.gethostname()}:{current_rank().rank}"


def main() -> int:
    namespace, mesh, hosts = sys.argv[1], sys.argv[2], int(sys.argv[3])
    kubeconfig = KubeConfig.from_path(sys.argv[4]) if len(sys.argv) > 4 else None

    job = KubernetesJob(namespace=namespace, timeout=120, kubeconfig=kubeconfig)
    job.add_mesh(mesh, hosts)
    host_mesh = getattr(job.state(cached_path=None), mesh)

    procs = host_mesh.spawn_procs(per_host={"procs": 2})
    greeters = procs.spawn("greeter", Greeter)

    everyone = greeters.hello.call().get(timeout=CALL_TIMEOUT)
    replies = sorted(reply for _, reply in everyone.items())
    print("ALL", " ".join(replies), flush=True)

    one = greeters.slice(hosts=hosts - 1, procs=1).hello.call_one().get(timeout=CALL_TIMEOUT)
    print("SLICE", one, flush=True)
    print("ROUND1 OK", flush=True)
    if os.environ.get("CLIENT_ONCE") == "1":
        return 0

    deadline = time.monotonic() + WATCH_SECONDS
    while time.monotonic() < deadline:
        try:
            greeters.hello.call().get(timeout=CALL_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - any failure is the answer
            print(f"CALL FAILED: {type(e).__name__}: {e}", flush=True)
            return 0
        time.sleep(0.5)
    print("NO FAILURE SEEN", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
