"""The Monarch side of bench suite `monarch`: a plain Monarch client
(`KubernetesJob` defaults, in-cluster) on the workers of a hostmesh World.

    python monarch_bench.py NAMESPACE MESH HOSTS CALLS

Prints one JSON line with the call round trip to one actor and the
cast-plus-gather over every actor (2 procs per host, one actor each), in
microseconds and milliseconds, then `READY_FOR_KILL`; then calls every
actor until a call fails and prints a JSON line with the wall-clock time
of the failure and what it was.
"""

import json
import sys
import time

from monarch.actor import Actor, endpoint
from monarch.job.kubernetes import KubernetesJob

CALL_TIMEOUT = 60
WATCH_SECONDS = 180


class Ping(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


def percentiles(samples):
    samples = sorted(samples)
    pick = lambda p: samples[min(len(samples) - 1, round((len(samples) - 1) * p))]  # noqa: E731
    return pick(0.5), pick(0.99)


def main() -> int:
    namespace, mesh, hosts, calls = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    job = KubernetesJob(namespace=namespace, timeout=120)
    job.add_mesh(mesh, hosts)
    procs = getattr(job.state(cached_path=None), mesh).spawn_procs(per_host={"procs": 2})
    actors = procs.spawn("ping", Ping)
    one = actors.slice(hosts=hosts - 1, procs=1)

    for _ in range(max(10, calls // 10)):
        one.ping.call_one().get(timeout=CALL_TIMEOUT)
        actors.ping.call().get(timeout=CALL_TIMEOUT)
    rtt, cast = [], []
    for _ in range(calls):
        t = time.perf_counter()
        one.ping.call_one().get(timeout=CALL_TIMEOUT)
        rtt.append((time.perf_counter() - t) * 1e6)
    for _ in range(calls):
        t = time.perf_counter()
        actors.ping.call().get(timeout=CALL_TIMEOUT)
        cast.append((time.perf_counter() - t) * 1e3)
    (rtt50, rtt99), (cast50, cast99) = percentiles(rtt), percentiles(cast)
    print(json.dumps({"call_rtt_p50_us": rtt50, "call_rtt_p99_us": rtt99,
                      "cast_gather_p50_ms": cast50, "cast_gather_p99_ms": cast99,
                      "actors": hosts * 2}), flush=True)
    print("READY_FOR_KILL", flush=True)

    deadline = time.monotonic() + WATCH_SECONDS
    while time.monotonic() < deadline:
        try:
            actors.ping.call().get(timeout=CALL_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - any failure is the answer
            print(json.dumps({"error_at": time.time(), "error": f"{type(e).__name__}: {e}"[:300]}),
                  flush=True)
            return 0
    print(json.dumps({"error_at": None}), flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
