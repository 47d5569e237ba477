"""Clients of the metrics endpoint that ask for ``/metrics`` and never read the answer
(docs/security.md §7): the attacker of bench/metrics_attack.py and of
tests/e2e/test_metrics_e2e.py, run as an unprivileged user with the system interpreter,
so it uses the standard library only.

    /usr/bin/python3 bench/deaf_scrapers.py PORT COUNT [RATE] [RCVBUF]

Opens COUNT connections to 127.0.0.1:PORT, RATE a second (default 50), each with a
receive buffer of RCVBUF bytes (default 1024) set before it connects, sends ``GET
/metrics`` on each and never reads. Prints one JSON line (``{"opened": N, "failed": M}``)
once all are opened, then holds them until its standard input closes, and prints how many
the daemon reset meanwhile (``{"reset": R}``).
"""

from __future__ import annotations

import json
import resource
import socket
import sys
import time


def main(argv: list[str]) -> int:
    port, count = int(argv[0]), int(argv[1])
    rate = float(argv[2]) if len(argv) > 2 else 50.0
    rcvbuf = int(argv[3]) if len(argv) > 3 else 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 64), hard))
    held, failed = [], 0
    start = time.monotonic()
    for i in range(count):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        except OSError:
            failed += 1
            s.close()
            continue
        held.append(s)
    print(json.dumps({"opened": len(held), "failed": failed}), flush=True)
    sys.stdin.read()
    print(json.dumps({"reset": sum(1 for s in held if closed(s))}), flush=True)
    for s in held:
        s.close()
    return 0


def closed(s: socket.socket) -> bool:
    """The connection is gone (reset by the peer): TCP_INFO's first byte is the state, 7 TCP_CLOSE."""
    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] == 7


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
