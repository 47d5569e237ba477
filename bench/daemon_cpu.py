"""Part 10: the real daemon's whole-process CPU per process-sample, against psutil.

Starts ``memagent daemon --interval 0.1`` (10 Hz), attaches ``--processes`` idle processes
(default 1000, :class:`fleet.Fleet`), lets it settle, then reads the daemon's CPU time (user
+ system, all threads: ``/proc/PID/stat``) over ``--seconds`` (default 10) with no client
connected, and again with one subscriber reading every sample frame. CPU per
process-sample = CPU seconds / (ticks in the window x processes).

Baseline, in the same run on the same processes: ``psutil.Process.memory_info()`` (one
``statm`` read and parse per call, what a psutil-based monitor pays per process and
sample), µs per call of this benchmark's own CPU time.

    .venv/bin/python bench/daemon_cpu.py [--processes 1000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "agent"), str(ROOT / "protocol")]

import psutil  # noqa: E402
from fleet import Fleet, die_with_parent, proc_cpu, stop_daemon, wait_listening  # noqa: E402

from memagent.agent import raise_fd_limit  # noqa: E402
from memagent.client import Client  # noqa: E402
from memproto.frames import Sample  # noqa: E402


def ticks(sock: str) -> int:
    with Client(sock) as c:
        return c.status().tick.ticks


def window(daemon_pid: int, sock: str, seconds: float) -> tuple[float, int]:
    c0, t0 = proc_cpu(daemon_pid), ticks(sock)
    time.sleep(seconds)  # a measuring window, not synchronisation
    return proc_cpu(daemon_pid) - c0, ticks(sock) - t0


def psutil_baseline(pids: list[int], rounds: int = 5) -> float:
    procs = [psutil.Process(p) for p in pids]
    t0 = time.process_time()
    for _ in range(rounds):
        for p in procs:
            p.memory_info()
    return (time.process_time() - t0) / (rounds * len(procs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    raise_fd_limit()
    tmp = Path(tempfile.mkdtemp(prefix="memagent-cpu-bench-"))
    sock = str(tmp / "m.sock")
    fleet = Fleet(args.processes, python=20)
    daemon = None
    try:
        fleet.start()
        daemon = subprocess.Popen([sys.executable, "-m", "memagent.cli", "daemon", "--socket", sock,
                                   "--interval", "0.1"], stderr=subprocess.PIPE, text=True,
                                  preexec_fn=die_with_parent)
        wait_listening(daemon)
        with Client(sock, timeout=60) as c:
            attached = len(c.attach(fleet.pids).attached)
        time.sleep(3)  # settle: every process's first status reads and PSS read done (first reads: 10 % of a CPU)
        idle_cpu, idle_ticks = window(daemon.pid, sock, args.seconds)
        stop = threading.Event()

        def subscribe() -> None:
            with Client(sock) as sub:
                sub.subscribe()
                for frame in sub.stream():
                    if stop.is_set():
                        return
                    assert isinstance(frame, Sample) or frame is not None

        reader = threading.Thread(target=subscribe, daemon=True)
        reader.start()
        time.sleep(1)
        sub_cpu, sub_ticks = window(daemon.pid, sock, args.seconds)
        stop.set()
        base = psutil_baseline(fleet.pids)
    finally:
        if daemon is not None:
            stop_daemon(daemon)
        fleet.stop()
    print(f"daemon CPU per process-sample: {attached} idle processes at 10 Hz, {args.seconds:g} s windows")
    print(f"  reproduce: .venv/bin/python bench/daemon_cpu.py --processes {args.processes} --seconds {args.seconds:g}")
    print(f"  baseline psutil.Process.memory_info(): {base * 1e6:.2f} µs per call (this process's CPU)")
    for what, cpu, n in (("no client", idle_cpu, idle_ticks), ("1 subscriber", sub_cpu, sub_ticks)):
        per = cpu / max(1, n * attached)
        print(f"  {what:13s}: {per * 1e6:.2f} µs per process-sample ({n} ticks, {cpu:.2f} CPU s) "
              f"= {per / base:.2f}x psutil")
    return 0


if __name__ == "__main__":
    sys.exit(main())
