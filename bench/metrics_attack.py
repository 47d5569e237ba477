"""The kernel memory that clients which never read ``/metrics`` make the box hold
(docs/security.md §7, "Measured under attack"): a real daemon (``--interval 0.1``) watching
1000 processes (an exposition of ~290 KB), then 1,400 such clients of the test user
(bench/deaf_scrapers.py: 1 KiB receive buffers, 50 connections a second, held open).
Measured: the box's TCP memory (``/proc/net/sockstat``, ``TCP: ... mem`` in pages) before,
2 s after the last client opened, after they left, and its peak over the attack; orphaned
sockets; the daemon's VmRSS; and ten normal scrapes meanwhile.

Run as root (the test user ``memagent-test`` must exist; the tests create it):

    .venv/bin/python bench/metrics_attack.py [--clients 1400] [--processes 1000] [--tree DIR]

``--tree DIR`` runs the daemon of another source tree (``DIR/agent`` and ``DIR/protocol``
on ``PYTHONPATH``), e.g. a copy of an older commit: ``git archive OLD agent protocol | tar -x -C DIR``.
It prints the figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import http.client
import os
import pwd
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fleet import Fleet, proc_status_kb, stop_daemon  # noqa: E402
from tick_regularity import memagent_argv  # noqa: E402

TEST_USER = "memagent-test"
PAGE = os.sysconf("SC_PAGESIZE")


def tcp_memory() -> tuple[int, int]:
    """(bytes of TCP memory, orphaned sockets) of the box now."""
    with open("/proc/net/sockstat") as f:
        for line in f:
            if line.startswith("TCP:"):
                words = line.split()
                fields = dict(zip(words[1::2], map(int, words[2::2]), strict=True))
                return fields["mem"] * PAGE, fields["orphan"]
    raise RuntimeError("no TCP line in /proc/net/sockstat")


class Peak:
    """The most TCP memory and orphans seen, sampled in a thread until :meth:`stop`."""

    def __init__(self) -> None:
        self.memory, self.orphans = tcp_memory()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.25):
            memory, orphans = tcp_memory()
            self.memory, self.orphans = max(self.memory, memory), max(self.orphans, orphans)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def scrape_seconds(port: int) -> tuple[float, int]:
    """(seconds, HTTP status; 0: no whole answer) of one scrape."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        size = len(response.read())
        return time.perf_counter() - start, response.status if size else 0
    except (OSError, http.client.HTTPException):
        return time.perf_counter() - start, 0
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=1400)
    parser.add_argument("--processes", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--tree", help="run the daemon of this source tree")
    args = parser.parse_args()
    user = pwd.getpwnam(TEST_USER)
    env = dict(os.environ)
    if args.tree:
        tree = os.path.abspath(args.tree)
        env["PYTHONPATH"] = f"{tree}/agent:{tree}/protocol"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    argv = [sys.executable, "-m", "memagent.cli"] if args.tree else memagent_argv()
    with tempfile.TemporaryDirectory() as tmp, Fleet(args.processes) as fleet:
        sock = os.path.join(tmp, "d.sock")
        port = free_port()
        daemon = subprocess.Popen([*argv, "daemon", "--socket", sock, "--interval", "0.1", "--state-dir", "",
                                   "--no-stacks", "--no-record", "--metrics", f"127.0.0.1:{port}"],
                                  stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            attach(sock, fleet.pids)
            time.sleep(1.0)
            seconds, _ = scrape_seconds(port)
            size = len(fetch(port))
            before, orphans_before = tcp_memory()
            rss_before = proc_status_kb(daemon.pid, "VmRSS")["VmRSS"]
            peak = Peak()
            attacker = subprocess.Popen(["/usr/bin/python3", str(HERE / "deaf_scrapers.py"), str(port),
                                         str(args.clients), str(args.rate)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, preexec_fn=drop_to(user))
            assert attacker.stdout is not None and attacker.stdin is not None
            opened = attacker.stdout.readline().strip()
            time.sleep(2.0)
            after, orphans = tcp_memory()
            during = [scrape_seconds(port) for _ in range(10)]
            rss_after = proc_status_kb(daemon.pid, "VmRSS")["VmRSS"]
            attacker.stdin.close()
            attacker.wait(timeout=60)
            peak.stop()
            time.sleep(1.0)
            released, orphans_released = tcp_memory()
        finally:
            stop_daemon(daemon)
    mib = 1024 * 1024
    print(f"daemon: {'tree ' + args.tree if args.tree else 'this tree'}, {args.processes} processes, "
          f"exposition {size / 1024:.0f} KiB, a scrape {seconds * 1000:.1f} ms")
    print(f"attacker ({TEST_USER}): {args.clients} non-reading clients at {args.rate:g}/s: {opened}")
    print(f"TCP memory: {before / mib:.1f} MiB before, {after / mib:.1f} MiB with the clients held "
          f"(+{(after - before) / mib:.1f} MiB), {released / mib:.1f} MiB after they left")
    print(f"orphaned sockets: {orphans_before} before, {orphans} with the clients held, {orphans_released} after")
    print(f"peak during the attack (sampled every 0.25 s): TCP memory +{(peak.memory - before) / mib:.1f} MiB, "
          f"{peak.orphans} orphans")
    ok = sum(1 for _, status in during if status == 200)
    times = sorted(s for s, _ in during)
    print(f"scrapes during the attack: {ok}/{len(during)} answered 200, median {times[len(times) // 2] * 1000:.1f} ms, "
          f"max {times[-1] * 1000:.1f} ms")
    print(f"daemon VmRSS: {rss_before / 1024:.1f} MiB before, {rss_after / 1024:.1f} MiB during")


def fetch(port: int) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read()
    finally:
        conn.close()


def attach(sock: str, pids: list[int]) -> None:
    from memagent.client import Client
    from memproto.client_side import DaemonNotRunning

    deadline = time.monotonic() + 30
    while True:
        try:
            with Client(sock, timeout=10) as c:
                for i in range(0, len(pids), 500):
                    c.attach(pids[i:i + 500], label="fleet")
                return
        except (DaemonNotRunning, FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def drop_to(user: pwd.struct_passwd) -> Callable[[], None]:
    def preexec() -> None:
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)

    return preexec


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    main()
