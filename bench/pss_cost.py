"""What a PSS read costs, per resident GiB and per second at 100 watched processes.

``smaps_rollup`` walks the whole memory map of the target and holds its mmap lock while
it does: the time of one read is also how long the target's own mmap/munmap/page faults
on new areas may wait. The daemon reads it (with ``maps`` and ``stat``, for the sharing
keys: ``ProcessHandle.sharing``) at attach, every ``[host] pss_refresh`` (30 s), and when
sharing changes (memagent.alerting.sharing), in a worker thread, at most DUTY of a CPU.

Starts ``--processes`` Python processes (default 100) holding ``--mib`` MiB each (default
40) of written memory, then times over ``--rounds`` rounds: the baseline ``statm`` read
(what a tick reads), ``smaps_rollup`` alone, and the daemon's full sharing read.

    .venv/bin/python bench/pss_cost.py [--processes 100] [--mib 40] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "agent"), str(ROOT / "protocol")]

from memagent.alerting.sharing import DUTY  # noqa: E402
from memagent.config import HeadroomConfig  # noqa: E402
from memagent.proc.procfs import ProcessHandle, ProcFS  # noqa: E402

HOLDER = ("import sys\nb = bytearray(b'\\x01') * ({mib} << 20)\nsys.stdout.write('ok\\n')\nsys.stdout.flush()\n"
          "sys.stdin.read()\n")


def read_file(pid: int, name: str) -> None:
    fd = os.open(f"/proc/{pid}/{name}", os.O_RDONLY)
    try:
        while os.read(fd, 65536):
            pass
    finally:
        os.close(fd)


def timed(pids: list[int], read: Callable[[int], object], rounds: int) -> float:
    """Median over rounds of the seconds one pass over every process takes."""
    passes = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for pid in pids:
            read(pid)
        passes.append(time.perf_counter() - t0)
    return statistics.median(passes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=100)
    ap.add_argument("--mib", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    procs = [subprocess.Popen([sys.executable, "-c", HOLDER.format(mib=args.mib)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE) for _ in range(args.processes)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == b"ok\n"
        pids = [p.pid for p in procs]
        procfs = ProcFS()
        handles = {pid: ProcessHandle(procfs, pid) for pid in pids}
        resident_mib = sum(h.memory()[0].resident for h in handles.values()) * os.sysconf("SC_PAGE_SIZE") / 2**20
        statm = timed(pids, lambda pid: handles[pid].statm_bytes(), args.rounds)
        rollup = timed(pids, lambda pid: read_file(pid, "smaps_rollup"), args.rounds)
        sharing = timed(pids, lambda pid: handles[pid].sharing(keys=False), args.rounds)
        with_keys = timed(pids, lambda pid: handles[pid].sharing(), args.rounds)
        for h in handles.values():
            h.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    n = args.processes
    refresh = HeadroomConfig().pss_refresh
    print(f"PSS read cost: {n} processes, {resident_mib / 1024:.2f} GiB resident in all "
          f"({resident_mib / n:.0f} MiB each), median of {args.rounds} passes")
    print(f"  reproduce: .venv/bin/python bench/pss_cost.py --processes {n} --mib {args.mib} --rounds {args.rounds}")
    print(f"  baseline statm read (a tick):     {statm / n * 1e6:8.1f} µs per process")
    for what, t in (("smaps_rollup", rollup), ("sharing read (rollup+stat)", sharing),
                    ("first sharing read (+maps)", with_keys)):
        print(f"  {what + ':':34s}{t / n * 1e6:8.1f} µs per process = {t / statm:6.0f}x statm; "
              f"{t / resident_mib * 1e6:.2f} µs per resident MiB = {t / resident_mib * 1024 * 1e3:.2f} ms per GiB")
    print(f"  one pass over all {n} (maps is read at the first read, and when file-backed memory moved): "
          f"{sharing * 1e3:.1f} ms (each target's mmap lock held for its own part only)")
    print(f"  per second, periodic refresh every {refresh:g} s: {sharing / refresh * 1e3:.2f} ms/s "
          f"= {sharing / refresh:.3%} of a CPU; at most {DUTY:.0%} of a CPU however often sharing changes "
          f"(duty cycle), i.e. one full pass every {sharing / DUTY:.2f} s at worst")
    return 0


if __name__ == "__main__":
    sys.exit(main())
