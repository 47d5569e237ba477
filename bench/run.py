"""memagent benchmark: ``make bench`` (or ``.venv/bin/python bench/run.py`` from the root).

Prints a report; asserts nothing. See bench/README.md for what each number means.

1. cost per process-sample of the whole path (collect + encode + send to a real
   subscriber), at 100 and 1000 watched processes, and its split  (sample_path.py)
2. baselines on the same processes: psutil memory_info(), fresh /proc reads
3. the target line: <= 5 us per process-sample at 1000 processes
4. the daemon's own RSS at 1000 processes with full history          (daemon_rss.py)
5. tick regularity of the real daemon at 1000 processes, 0.1 s      (tick_regularity.py)
6. memtop at 1000 rows                                              (memtop_update.py)
7. what py-spy stack dumps cost a watched workload                  (stacks_overhead.py)
8. alert latency: headroom crossing to hook                         (alert_latency.py)
9. what a PSS read costs, per GiB and per second at 100 processes   (pss_cost.py)
10. the daemon's whole-process CPU per process-sample, against psutil (daemon_cpu.py)
11. the flight recorder: bytes per hour and its cost, 100 processes at 0.5 s (record_size.py)
12. peaks against the anchor, mprof run at 0.1 s, on a spiky workload  (mprof_compare.py)
13. the pytest plugin against the anchor, pytest-memray: overhead, what each catches (pytest_compare.py)
14. the Prometheus endpoint at 1000 processes: scrape time, RSS, tick delay (metrics_scrape.py)
15. growth attribution against known truth: six scenarios, credit to the allocating function
    and the stack at peak                                           (stack_attribution.py)
16. the daemon's whole cost (itself + its children) on 12 bursty processes, against a psutil
    poller                                                          (fleet_cost.py)
17. what a command line costs: memagent ls/status/attach against `import psutil`, memagent
    run's overhead and its starts beside two CPU hogs                (cli_cost.py)
18. memtop --replay of an hour of 100 busy processes: the first screen, End, a seek back,
    the peak RSS                                                     (replay_cost.py)

All watched processes are children of this process in one process group, killed on the
way out whatever happens (SIGTERM included).
"""

from __future__ import annotations

import asyncio
import os
import platform
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import daemon_rss  # noqa: E402
import msgpack  # noqa: E402
import psutil  # noqa: E402
import sample_path  # noqa: E402
import tick_regularity  # noqa: E402
from fleet import Fleet  # noqa: E402

from memagent.agent import raise_fd_limit  # noqa: E402

PROCESSES = 1000
#: Parts 6-18, each in a process of its own: (title, script).
PARTS_ALONE = (
    ("6. memtop at 1000 rows", "memtop_update.py"),
    ("7. stacks overhead on the watched process", "stacks_overhead.py"),
    ("8. alert latency: headroom crossing to hook", "alert_latency.py"),
    ("9. PSS read cost at 100 processes", "pss_cost.py"),
    ("10. daemon CPU per process-sample at 1000 idle processes, 10 Hz", "daemon_cpu.py"),
    ("11. flight recorder: bytes per hour and cost, 100 processes at 0.5 s", "record_size.py"),
    ("12. peaks against mprof run (0.1 s) on a spiky workload", "mprof_compare.py"),
    ("13. pytest --memagent against pytest-memray on one sample suite", "pytest_compare.py"),
    ("14. metrics endpoint at 1000 processes: scrape time, RSS, tick delay", "metrics_scrape.py"),
    ("15. growth attribution against known truth (where memory grew, stack at peak)", "stack_attribution.py"),
    ("16. the daemon's whole cost on 12 bursty processes (itself + children, against a psutil poller)",
     "fleet_cost.py"),
    ("17. command lines: ls/status/attach CPU against import psutil; memagent run's overhead, under two CPU hogs",
     "cli_cost.py"),
    ("18. memtop --replay of an hour of 100 busy processes: first screen, seeks, RSS", "replay_cost.py"),
)
PYTHONS = 20


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that kill children


def _command() -> str:
    root = os.path.dirname(HERE)
    py = os.path.relpath(sys.executable, root) if sys.executable.startswith(root) else sys.executable
    return f"cd {root} && {py} bench/run.py    (or: make bench)"


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    signal.signal(signal.SIGTERM, _terminate)
    started = time.monotonic()
    limit = raise_fd_limit()
    print("memagent benchmark")
    print(f"  reproduce: {_command()}")
    print(f"  machine: {os.cpu_count()} CPUs, Linux {platform.release()}, Python {platform.python_version()}, "
          f"psutil {psutil.__version__}, msgpack {'.'.join(map(str, msgpack.version))}, "
          f"RLIMIT_NOFILE {limit}; {_load()} at start")
    fleet = Fleet(PROCESSES, python=PYTHONS)
    try:
        t0 = time.monotonic()
        fleet.start()
        pids = fleet.pids
        print(f"  fleet: {PYTHONS} idle python + {PROCESSES - PYTHONS} sleep processes, "
              f"process group {fleet.pgid}, started in {time.monotonic() - t0:.1f} s")
        print()

        print("== 1-3. per process-sample cost: collect + encode + send to 1 real subscriber ==")
        results = asyncio.run(sample_path.run_parts(pids))
        print("\n".join(sample_path.report(results)))
        print()

        print(f"== 4. daemon RSS at {PROCESSES} watched processes ==")
        print("\n".join(daemon_rss.report(daemon_rss.measure(pids), PROCESSES)))
        print()

        print("== 5. tick regularity ==")
        print("\n".join(tick_regularity.report(tick_regularity.measure(pids), PROCESSES)))
        print()
    finally:
        fleet.stop()

    # memtop runs in its own process so that its RSS is its own; the workloads, daemons and
    # py-spy of the others are processes of their own too: each part runs alone.
    for title, script in PARTS_ALONE:
        print(f"== {title} ==", flush=True)
        subprocess.run([sys.executable, os.path.join(HERE, script)], check=False)
        print()
    print(f"done in {time.monotonic() - started:.0f} s; {_load()} at end (other load on the box skews wall times)")
    print(f"reproduce: {_command()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
