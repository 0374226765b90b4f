"""Monarch's provisioning mode as a Monarch user writes it, unmodified:
KubernetesJob.add_mesh with an ImageSpec creates a MonarchMesh (served by
hostmesh, not the Monarch operator), from outside the cluster (a kubeconfig,
so Monarch port-forwards to a worker itself). It spawns procs on every host,
an actor on every proc, calls an endpoint on all of them and on one slice,
then job.kill() deletes the MonarchMesh.

Usage: python monarch_provision.py KUBECONFIG NAMESPACE MESH IMAGE HOSTS [SHM]

SHM, when given, is ImageSpec's shared_memory_size (a memory /dev/shm).
Prints one line `RESULT {...}` (JSON) after each step; exits non-zero on
any failure.
"""

import json
import socket
import sys

from monarch.actor import Actor, current_rank, endpoint
from monarch.job.kubernetes import ImageSpec, KubeConfig, KubernetesJob

PROCS_PER_HOST = 2


class Where(Actor):
    """Says which proc it runs on."""

    @endpoint
    def where(self) -> dict:
        return {"rank": current_rank().rank, "host": socket.gethostname()}


def report(step, **fields):
    print("RESULT " + json.dumps({"step": step, **fields}), flush=True)


def main():
    kubeconfig, namespace, mesh, image, hosts = sys.argv[1:6]
    shm = sys.argv[6] if len(sys.argv) > 6 else None
    hosts = int(hosts)
    job = KubernetesJob(
        namespace=namespace,
        timeout=180,
        kubeconfig=KubeConfig.from_path(kubeconfig),
    )
    job.add_mesh(mesh, hosts, image_spec=ImageSpec(image, shared_memory_size=shm))
    state = job.state(cached_path=None)
    host_mesh = getattr(state, mesh)
    report("connected")

    procs = host_mesh.spawn_procs(per_host={"procs": PROCS_PER_HOST})
    actors = procs.spawn("where", Where)
    everyone = [v for _, v in actors.where.call().get().items()]
    report(
        "all",
        ranks=sorted(v["rank"] for v in everyone),
        hosts=sorted({v["host"] for v in everyone}),
    )

    last = actors.slice(hosts=hosts - 1)
    one = [v for _, v in last.where.call().get().items()]
    report("slice", ranks=sorted(v["rank"] for v in one), hosts=sorted({v["host"] for v in one}))

    job.kill()
    report("killed")


if __name__ == "__main__":
    main()
