"""The daemon's whole cost on a fleet of busy, bursty Python processes (issue 26).

Idle processes flatter a sampler that skips unchanged ``statm``; inference services are not
idle. This starts ``--processes`` (12) bursty Python processes (``bursty_target.py``: a
40 MiB base under a sawtooth of 60-150 MiB rising in ten steps and freed every 1.5-3.6 s,
every third one with 4-8 request threads), then, one mode after another on the same fleet:

* ``defaults``: ``memagent daemon`` at its defaults (stacks, Austin bursts, PSS, the flight
  recorder and state in a private state directory), every fleet process attached;
* ``no-stacks``: the same with ``--no-stacks``;
* ``baseline``: what a psutil-based exporter pays: one process polling
  ``psutil.Process.memory_info()`` of every fleet process at the daemon's interval (0.5 s),
  the stand-in for process-exporter where that is not installed (it is not, here).

Cost is measured from outside as an operator would: the CPU time (user + system) of the
daemon, of every child it reaped (py-spy, Austin: ``cutime + cstime``) and of the children
still running at either end of the window, over ``--seconds`` (60) after a warm-up, as a
percentage of one core. It prints the split and the ratio to the baseline; it asserts
nothing (a noisy box skews every figure: the load average is printed).

    .venv/bin/python bench/fleet_cost.py [--processes 12] [--seconds 60] [--modes defaults,no-stacks,baseline]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "agent"), str(ROOT / "protocol")]

from fleet import in_group, stop_daemon, wait_listening  # noqa: E402

from memagent.client import Client  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")
SIZES_MIB = (60, 80, 100, 120, 150)
POLLER = """
import sys, time, psutil
pids = [int(p) for p in sys.argv[2:]]
interval = float(sys.argv[1])
procs = [psutil.Process(p) for p in pids]
nxt = time.monotonic()
while True:
    for p in procs:
        try:
            p.memory_info()
        except psutil.Error:
            pass
    nxt += interval
    time.sleep(max(0.0, nxt - time.monotonic()))
"""


def _stat(pid: int) -> tuple[int, list[str]] | None:
    """(parent PID, the fields after the command name) of ``/proc/PID/stat``; None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), fields


def tree_cpu(root: int) -> tuple[float, float]:
    """CPU seconds of ``root`` itself (all threads), and of its children: those it reaped
    (``cutime + cstime``) plus every live descendant's own and reaped."""
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            got = _stat(int(name))
            if got is not None:
                parents[int(name)], stats[int(name)] = got
    own = stats.get(root)
    if own is None:
        raise SystemExit(f"process {root} is gone")
    mine = (int(own[11]) + int(own[12])) / CLK
    children = (int(own[13]) + int(own[14])) / CLK
    live = {root}
    changed = True
    while changed:  # descendants, however deep (a shell between daemon and Austin)
        changed = False
        for pid, ppid in parents.items():
            if ppid in live and pid not in live:
                live.add(pid)
                changed = True
                f = stats[pid]
                children += sum(int(x) for x in f[11:15]) / CLK
    return mine, children


class Bursty:
    """The fleet: ``n`` bursty processes in one process group, killed together."""

    def __init__(self, n: int) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        pgid = 0
        for i in range(n):
            argv = [sys.executable, str(HERE / "bursty_target.py"), "--mib", str(SIZES_MIB[i % len(SIZES_MIB)]),
                    "--period", f"{1.5 + (2.1 * i / max(1, n - 1)):.2f}",
                    "--threads", str(4 + i % 5 if i % 3 == 2 else 0)]
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 preexec_fn=in_group(pgid))
            pgid = pgid or p.pid
            self.procs.append(p)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.procs[0].pid, 9)
        for p in self.procs:
            p.kill()
            p.wait()


def measure(pid: int, seconds: float) -> tuple[float, float]:
    m0, c0 = tree_cpu(pid)
    time.sleep(seconds)  # a measuring window, not synchronisation
    m1, c1 = tree_cpu(pid)
    return m1 - m0, c1 - c0


def run_daemon(mode: str, pids: list[int], seconds: float, warmup: float) -> tuple[float, float]:
    tmp = Path(tempfile.mkdtemp(prefix="memagent-fleet-cost-"))
    sock = str(tmp / "m.sock")
    argv = [sys.executable, "-m", "memagent.cli", "daemon", "--socket", sock, "--state-dir", str(tmp / "state")]
    if mode == "no-stacks":
        argv.append("--no-stacks")
    daemon = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, preexec_fn=in_group(0))
    try:
        wait_listening(daemon)
        with Client(sock, timeout=60) as c:
            c.attach(pids)
        time.sleep(warmup)
        return measure(daemon.pid, seconds)
    finally:
        stop_daemon(daemon)


def run_baseline(pids: list[int], seconds: float, warmup: float, interval: float) -> tuple[float, float]:
    poller = subprocess.Popen([sys.executable, "-c", POLLER, str(interval), *map(str, pids)],
                              preexec_fn=in_group(0))
    try:
        time.sleep(warmup)
        return measure(poller.pid, seconds)
    finally:
        poller.kill()
        poller.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=12)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=8.0)
    ap.add_argument("--modes", default="defaults,no-stacks,baseline")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - {"defaults", "no-stacks", "baseline"}
    if unknown:
        ap.error(f"unknown modes: {', '.join(sorted(unknown))}")
    fleet = Bursty(args.processes)
    results: dict[str, tuple[float, float]] = {}
    load0 = os.getloadavg()
    try:
        time.sleep(2)  # every process past its start-up and its base in
        for mode in modes:
            if mode == "baseline":
                results[mode] = run_baseline(fleet.pids, args.seconds, args.warmup, 0.5)
            else:
                results[mode] = run_daemon(mode, fleet.pids, args.seconds, args.warmup)
    finally:
        fleet.stop()
    print(f"fleet cost: {args.processes} bursty Python processes (40 MiB base + a 60-150 MiB sawtooth every "
          f"1.5-3.6 s, every third with 4-8 threads), {args.seconds:g} s windows after {args.warmup:g} s warm-up")
    print(f"  load average {' '.join(f'{x:.2f}' for x in load0)} at start, "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at end (the fleet itself loads the box)")
    print(f"  {'mode':10s} {'itself':>8s} {'children':>9s} {'total':>8s}  (% of one core)")
    base = results.get("baseline")
    for mode, (mine, children) in results.items():
        total = (mine + children) / args.seconds * 100
        ratio = ""
        if base and sum(base) > 0 and mode != "baseline":
            ratio = f"   = {(mine + children) / sum(base):.1f}x the psutil poller"
        print(f"  {mode:10s} {mine / args.seconds * 100:7.1f}% {children / args.seconds * 100:8.1f}% "
              f"{total:7.1f}%{ratio}")
    print("  target (issue 26): --no-stacks <= 1.5 % of one core; defaults with stacks <= 5 % (the stacks issue)")
    print(f"  reproduce: .venv/bin/python bench/fleet_cost.py --processes {args.processes} --seconds {args.seconds:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
