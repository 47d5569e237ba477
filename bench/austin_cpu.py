"""Austin's CPU under a user's threaded, growing processes (docs/security.md section 14).

Usage, as root: ``bench/austin_cpu.py N THREADS SECONDS [daemon flags...]``. Starts a
daemon (``--interval 0.1``), N ``tests/threaded_grower.py THREADS`` as ``memagent-test``
under the system python3, attaches them, waits 3 s, then measures the daemon's whole
process tree (itself, its reaped children, its live children) over SECONDS. Prints the
figures; asserts nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from conftest import Daemon  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
GROWER = str(HERE.parent / "tests" / "threaded_grower.py")


def cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS, (int(fields[13]) + int(fields[14])) / TICKS


def live_children(pid: int) -> float:
    total = 0.0
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                total += sum(cpu(int(p)))
        except (OSError, ValueError, IndexError):
            continue
    return total


def tree(pid: int) -> tuple[float, float]:
    own, reaped = cpu(pid)
    return own, reaped + live_children(pid)


def main() -> None:
    n, threads, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    extra = sys.argv[4:]
    d = Daemon(os.environ.get("SOCK", "/tmp/memagent-austin-cpu.sock"), "--interval", "0.1", "--no-gpu",
               "--no-record", *extra)
    d.wait_listening()
    targets = [subprocess.Popen(["/usr/bin/python3", GROWER, str(threads)], stdout=subprocess.PIPE, text=True,
                                user="memagent-test", extra_groups=[], cwd="/") for _ in range(n)]
    try:
        pids = [int((t.stdout.readline() if t.stdout else "").split()[2]) for t in targets]
        with d.client(timeout=60) as c:
            c.attach(pids)
            time.sleep(3)
            own0, children0 = tree(d.proc.pid)
            t0 = time.monotonic()
            time.sleep(seconds)
            own1, children1 = tree(d.proc.pid)
            elapsed = time.monotonic() - t0
            status = c.status()
    finally:
        for t in targets:
            t.kill()
        d.stop()
    own, children = 100 * (own1 - own0) / elapsed, 100 * (children1 - children0) / elapsed
    print(f"{n} x {threads} threads {extra}: daemon {own:.1f} % of a core, Austin children {children:.1f} %, "
          f"tree {own + children:.1f} % over {elapsed:.0f} s; {status.sampler_bursts} bursts; "
          f"{status.stack_sampler_note}")


if __name__ == "__main__":
    main()
