"""A Monarch client of a World whose workers serve Monarch's TLS transport
(`spec.monarch.transport: Tls`, docs/monarch.md "TLS"), written with
Monarch's public API only. Its certificate, key and CA are what the
World's client Secret holds, mounted where Monarch reads them
(`HYPERACTOR_TLS_CERT`, `_KEY`, `_CA`); nothing here handles a
certificate.

    python monarch_tls_client.py WORKERS UIDS

WORKERS: the workers' addresses as they advertise them, comma-separated
(`tls://<pod FQDN>:<port>`). UIDS: their pods' uids, comma-separated, from
which Monarch 0.8 derives each worker's service identity (0.7 uses plain
addresses). The client attaches in duplex through the first worker, so no
worker dials it back: its certificate needs no name of its own.

Prints `TLS OK <replies>` and exits 0, or `TLS FAILED: <error>` and exits 1.
"""

import os
import socket
import sys

from monarch.actor import Actor, attach, attach_to_workers, endpoint
from monarch._src.job import service_identity as si


class Greeter(Actor):
    @endpoint
    def hello(self) -> str:
        return socket.getfqdn()


def main() -> int:
    plain = sys.argv[1].split(",")
    uids = sys.argv[2].split(",")
    workers = plain
    if hasattr(si, "service_proc_id_from_uuid"):
        workers = [
            si.service_proc_addr(w, si.service_proc_id_from_uuid(u))
            for w, u in zip(plain, uids)
        ]
    try:
        attach(plain[0])
        hosts = attach_to_workers(workers=workers, ca="trust_all_connections")
        hosts.initialized.get(timeout=60)
        greeters = hosts.spawn_procs(per_host={"procs": 1}).spawn("greeter", Greeter)
        replies = greeters.hello.call().get(timeout=60)
    except Exception as e:  # noqa: BLE001 - the test reads why
        print(f"TLS FAILED: {e!r}", flush=True)
        return 1
    print("TLS OK", " ".join(sorted(r for _, r in replies.items())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
