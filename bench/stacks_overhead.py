"""Part 7: what reading Python stacks costs the watched process ("the target must not notice us").

Two pure-Python workloads, each timed by itself (``time.perf_counter`` inside the
workload, from a "go" line on its stdin to the end of its work, so neither its start-up
nor the daemon's attach counts):

- ``cpu``: a tight arithmetic loop, no allocation (RSS flat);
- ``alloc``: builds lists of tuples/str/bytearray/dict (small objects, pymalloc arenas)
  at ~1 GB/s in cycles of ~240 MiB and drops them, so RSS climbs by far more than the
  daemon's 32 MiB growth threshold between two 0.1 s ticks and falls back each cycle:
  nearly every tick sees a growth (or peak) trigger.

Each is run in these modes, interleaved round by round (bare, default, high, record,
bare, ...), medians per mode:

- ``bare``: nothing watches it;
- ``default``: the real ``memagent daemon --interval 0.1`` (10 Hz) with stacks at the
  default budget (4 dumps/s), the workload attached;
- ``high``: the same with ``--stack-budget 50``; for ``alloc`` the growth triggers then
  take a dump at (almost) every tick; ``cpu`` never grows, so a client thread here asks
  for a fresh stack (``stack PID``, on demand) every 0.1 s instead: a dump per tick too;
- ``record``: ``py-spy record --pid PID --rate 100`` in its default, *blocking* mode (it
  stops the target for each sample), for comparison.

In the watched modes the daemon attaches and takes its first (rotation) dump before
the workload is told to go; in ``record`` py-spy has said it is sampling. The dumps
counted per run are ``stack_dumps`` of ``memagent status`` at the end minus at "go".
Every process (workload, daemon, py-spy) leads a process group of its own, is killed in
a ``finally`` block and dies with the benchmark (PR_SET_PDEATHSIG).

    .venv/bin/python bench/stacks_overhead.py [--rounds N] [--workloads cpu,alloc] [--modes default,high,record]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from fleet import in_group, proc_cpu  # noqa: E402
from tick_regularity import memagent_argv  # noqa: E402

CPU_ITERATIONS = 30_000_000
ALLOC_CYCLES, ALLOC_STEPS, ALLOC_ROWS = 4, 16, 20_000
INTERVAL = 0.1
HIGH_BUDGET = 50.0
RECORD_RATE = 100
#: Every mode says "go" no sooner than this after the workload is ready: work started right
#: after a process start runs measurably slower here (~7% on a 2-CPU VM), and the watched
#: modes wait about this long anyway for the daemon to start and take its first dump.
SETTLE = 1.0
ROUNDS = 6
WORKLOADS = ("cpu", "alloc")
MODES = ("bare", "default", "high", "record")


# --------------------------------------------------------------------------- the workload


def cpu_work() -> int:
    x = 0
    for i in range(CPU_ITERATIONS):
        x = (x * 31 + i) % 1000003
    return x


def alloc_work() -> int:
    n = 0
    for _ in range(ALLOC_CYCLES):
        hold = []
        for _ in range(ALLOC_STEPS):
            hold.append([(i, str(i), bytearray(384), {"i": i}) for i in range(ALLOC_ROWS)])
        n += len(hold)
        del hold
    return n


def workload_main(kind: str) -> int:
    work = cpu_work if kind == "cpu" else alloc_work
    print("ready", flush=True)
    sys.stdin.readline()  # "go": the observer is attached and sampling
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0, c0 = time.perf_counter(), time.process_time()
    work()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"wall": wall, "cpu": cpu, "vcsw": r1.ru_nvcsw - r0.ru_nvcsw,
                      "ivcsw": r1.ru_nivcsw - r0.ru_nivcsw}), flush=True)
    sys.stdin.readline()  # stay alive (idle) until the observer has been read
    return 0


# --------------------------------------------------------------------------- the controller

def find_py_spy() -> str | None:
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


@dataclass
class Run:
    workload: str
    mode: str
    round: int = 0
    wall: float = 0.0
    settle: float = 0.0  # from "ready" to "go"
    vcsw: int = 0  # the workload's voluntary context switches in the timed part (it blocked)
    ivcsw: int = 0  # involuntary ones (it was preempted)
    cpu: float = 0.0
    dumps: int | None = None
    observer_cpu: float | None = None  # daemon (+ its py-spy children) or py-spy record, in the timed part
    state: str | None = None
    samples: int | None = None  # py-spy record's own count
    error: str | None = None


class Lines:
    """A thread that reads a pipe into lines, so a deadline can be put on each."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self.thread.start()

    def _read(self, pipe: IO[bytes]) -> None:
        for raw in pipe:
            with self.cond:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.lines.append("")  # EOF
            self.cond.notify_all()

    def wait_for(self, pred: Any, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    if pred(line):
                        return line
                if self.lines and self.lines[-1] == "" and not self.thread.is_alive():
                    raise RuntimeError("pipe closed: " + " | ".join(self.lines[-5:]))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError("timed out: " + " | ".join(self.lines[-5:]))
                self.cond.wait(left)


def _spawn(argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, preexec_fn=in_group(), **kw)


def _kill(p: subprocess.Popen[bytes] | None) -> None:
    if p is None:
        return
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(5)


def _connect(sock: str, daemon: subprocess.Popen[bytes], timeout: float = 20.0) -> Any:
    from memagent.client import Client
    from memproto.client_side import DaemonNotRunning

    deadline = time.monotonic() + timeout
    while True:
        try:
            return Client(sock, timeout=20)
        except DaemonNotRunning:
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the daemon did not start") from None
            time.sleep(0.02)


def _stack_state(client: Any, pid: int) -> str | None:
    for p in client.list():
        if p.pid == pid:
            return p.stack_state  # type: ignore[no-any-return]
    return None


def run_one(workload: str, mode: str, py_spy: str, tmp: str, round_: int = 0) -> Run:
    res = Run(workload, mode, round_)
    sock = os.path.join(tmp, "d.sock")
    err = open(os.path.join(tmp, f"{mode}.err"), "w+b")
    target = daemon = recorder = None
    client = None
    stop = threading.Event()
    dumps0, cpu0 = 0, 0.0
    demander: threading.Thread | None = None
    try:
        target = _spawn([sys.executable, os.path.abspath(__file__), "--workload", workload],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        assert target.stdin is not None and target.stdout is not None
        out = Lines(target.stdout)
        out.wait_for(lambda s: s == "ready", 20)
        ready = time.monotonic()
        pid = target.pid

        if mode in ("default", "high"):
            argv = [*memagent_argv(), "daemon", "--socket", sock, "--interval", str(INTERVAL), "--py-spy", py_spy]
            if mode == "high":
                argv += ["--stack-budget", str(HIGH_BUDGET)]
            daemon = _spawn(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
            client = _connect(sock, daemon)
            client.attach([pid])
            deadline = time.monotonic() + 10
            while client.status().stack_dumps < 1 or _stack_state(client, pid) != "ok":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no first stack dump (state {_stack_state(client, pid)})")
                time.sleep(0.05)
            time.sleep(3 * INTERVAL)  # a few ticks: the watch is steady
            if mode == "high" and workload == "cpu":
                demander = threading.Thread(target=_demand, args=(sock, pid, stop), daemon=True)
                demander.start()
        elif mode == "record":
            recorder = _spawn([py_spy, "record", "--pid", str(pid), "--rate", str(RECORD_RATE), "--format", "raw",
                               "--output", os.devnull], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)  # py-spy says "Sampling process ..." on stdout
            assert recorder.stdout is not None
            rec = Lines(recorder.stdout)
            rec.wait_for(lambda s: "Sampling process" in s, 20)
            time.sleep(3 * INTERVAL)

        res.settle = time.monotonic() - ready
        if res.settle < SETTLE:
            time.sleep(SETTLE - res.settle)
        res.settle = time.monotonic() - ready
        if daemon is not None and client is not None:
            dumps0, cpu0 = client.status().stack_dumps, proc_cpu(daemon.pid, children=True)
        elif recorder is not None:
            cpu0 = proc_cpu(recorder.pid, children=True)
        target.stdin.write(b"go\n")
        target.stdin.flush()
        result = json.loads(out.wait_for(lambda s: s.startswith("{"), 120))
        res.wall, res.cpu, res.vcsw, res.ivcsw = result["wall"], result["cpu"], result["vcsw"], result["ivcsw"]

        if daemon is not None and client is not None:
            res.observer_cpu = proc_cpu(daemon.pid, children=True) - cpu0
            stop.set()
            if demander is not None:
                demander.join(5)
            res.dumps = client.status().stack_dumps - dumps0
            res.state = _stack_state(client, pid)
        if recorder is not None:
            res.observer_cpu = proc_cpu(recorder.pid, children=True) - cpu0
        target.stdin.close()  # the workload exits; py-spy record then stops by itself
        target.wait(10)
        if recorder is not None:
            recorder.wait(10)
            found = re.search(r"Samples: (\d+)", " ".join(rec.lines))
            res.samples = int(found.group(1)) if found else None
    except Exception as exc:  # noqa: BLE001 - reported in the table, the other runs go on
        res.error = f"{type(exc).__name__}: {exc}"
        err.seek(0)
        tail = err.read()[-300:].decode("utf-8", "replace").strip()
        if tail:
            res.error += f" [stderr: {tail}]"
    finally:
        stop.set()
        if client is not None:
            client.close()
        _kill(recorder)
        _kill(target)
        _kill(daemon)
        err.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(sock)
    return res


def _demand(sock: str, pid: int, stop: threading.Event) -> None:
    """A fresh stack every INTERVAL (on demand), so the flat ``cpu`` workload gets a dump per tick too."""
    from memagent.client import Client

    with contextlib.suppress(Exception), Client(sock, timeout=20) as c:  # the daemon killed under us: done
        due = time.monotonic()
        while not stop.is_set():
            c.stack(pid, fresh=True)
            due += INTERVAL
            stop.wait(max(0.0, due - time.monotonic()))


def _fmt_range(xs: list[float]) -> str:
    return f"{min(xs):.3f}..{max(xs):.3f}"


def report(runs: list[Run], workloads: tuple[str, ...] = WORKLOADS, modes: tuple[str, ...] = MODES) -> list[str]:
    lines = [f"{'workload':<8} {'mode':<8} {'runs':>4} {'wall s':>7} {'(min..max)':>13} {'ratio':>6} {'paired':>6} "
             f"{'cpu s':>6} {'ratio':>6} {'dumps/run':>15} {'observer cpu':>13} {'off-cpu':>8} {'csw v/i':>9} "
             f"{'settle':>6}"]
    verdict: list[str] = []
    for w in workloads:
        ok = {m: [r for r in runs if r.workload == w and r.mode == m and r.error is None] for m in modes}
        if not ok["bare"]:
            lines.append(f"{w:<8} no successful bare run")
            continue
        bare_wall = statistics.median(r.wall for r in ok["bare"])
        bare_cpu = statistics.median(r.cpu for r in ok["bare"])
        bare_by_round = {r.round: r.wall for r in ok["bare"]}
        for m in modes:
            rs = ok[m]
            if not rs:
                lines.append(f"{w:<8} {m:<8} {0:>4}  (every run failed)")
                continue
            wall = statistics.median(r.wall for r in rs)
            cpu = statistics.median(r.cpu for r in rs)
            if m in ("default", "high"):
                ds = [r.dumps or 0 for r in rs]
                dumps = f"{statistics.median(ds):g} ({min(ds)}..{max(ds)})"
            elif m == "record":
                ss = [r.samples for r in rs if r.samples is not None]
                dumps = f"{statistics.median(ss):g} samples" if ss else "?"
            else:
                dumps = "-"
            pairs = [r.wall / bare_by_round[r.round] for r in rs if r.round in bare_by_round]
            paired = f"{statistics.median(pairs):>5.3f}x" if pairs else "     -"
            obs = [r.observer_cpu / r.wall for r in rs if r.observer_cpu is not None and r.wall > 0]
            observer = f"{100 * statistics.median(obs):.1f}% core" if obs else "-"
            lines.append(f"{w:<8} {m:<8} {len(rs):>4} {wall:>7.3f} {_fmt_range([r.wall for r in rs]):>13} "
                         f"{wall / bare_wall:>5.3f}x {paired} {cpu:>6.3f} {cpu / bare_cpu:>5.3f}x {dumps:>15} "
                         f"{observer:>13} {1000 * statistics.median(r.wall - r.cpu for r in rs):>6.0f}ms "
                         f"{statistics.median(r.vcsw for r in rs):>4g}/{statistics.median(r.ivcsw for r in rs):<4g} "
                         f"{statistics.median(r.settle for r in rs):>5.2f}s")
            if m == "default":
                verdict.append(f"{w} {wall / bare_wall:.3f}x {'PASS' if wall / bare_wall <= 1.01 else 'MISS'}")
        spread = max(r.wall for r in ok["bare"]) / min(r.wall for r in ok["bare"]) - 1
        if verdict and verdict[-1].startswith(w) and spread > 0.02:
            verdict[-1] += f" (bare alone spread {100 * spread:.0f}%: 1% is below this box's noise)"
        lines.append(f"{'':<8} bare runs spread {100 * spread:.1f}% (max/min): differences smaller than "
                     "that are noise")
        states = sorted({r.state or "?" for m in ("default", "high") if m in ok for r in ok[m]})
        lines.append(f"{'':<8} stack state after the watched runs: {', '.join(states) or '-'}")
    failed = [r for r in runs if r.error]
    for r in failed:
        lines.append(f"FAILED {r.workload}/{r.mode}: {r.error}")
    if verdict:
        lines.append(f"target: slowdown <= 1.01x at defaults (median wall, watched-default / bare): "
                     f"{'; '.join(verdict)}")
    return lines


def measure(rounds: int = ROUNDS, workloads: tuple[str, ...] = WORKLOADS, modes: tuple[str, ...] = MODES,
            out: Any = print) -> list[Run]:
    py_spy = find_py_spy()
    if py_spy is None:
        raise RuntimeError("py-spy not found (pip install py-spy)")
    version = subprocess.run([py_spy, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    out(f"  {version} ({py_spy}); daemon: {' '.join(memagent_argv())} daemon --interval {INTERVAL} "
        f"[--stack-budget {HIGH_BUDGET:g} in 'high']")
    out(f"  workloads: cpu = {CPU_ITERATIONS:,} iterations of x = (x*31+i) % 1000003; "
        f"alloc = {ALLOC_CYCLES} cycles x {ALLOC_STEPS} x {ALLOC_ROWS:,} (int, str, bytearray(384), dict), dropped "
        f"each cycle")
    out(f"  {rounds} rounds, order per round: " + ", ".join(f"{w}/{m}" for w in workloads for m in modes)
        + "; a warm-up bare run of each first, discarded")
    tmp = tempfile.mkdtemp(prefix="memagent-bench-stacks-")
    runs: list[Run] = []
    try:
        for w in workloads:
            warm = run_one(w, "bare", py_spy, tmp)
            out(f"  warm-up {w}: {warm.wall:.3f} s" + (f" FAILED {warm.error}" if warm.error else ""))
        for i in range(rounds):
            t0 = time.monotonic()
            these = [run_one(w, m, py_spy, tmp, i) for w in workloads for m in modes]
            runs += these
            out(f"  round {i + 1}: " + "  ".join(
                f"{r.workload}/{r.mode} {'FAIL' if r.error else f'{r.wall:.3f}'}" for r in these)
                + f"  ({time.monotonic() - t0:.0f} s, {_load()})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of: cpu,alloc")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated; bare is always run")
    args = parser.parse_args(argv)
    workloads = tuple(w for w in WORKLOADS if w in args.workloads.split(","))
    modes = tuple(m for m in MODES if m == "bare" or m in args.modes.split(","))
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.monotonic()
    ncpu = len(os.sched_getaffinity(0))
    print(f"  {ncpu} CPUs usable ({os.cpu_count()} on the box); {_load()} at start")
    if ncpu <= 2:
        print(f"  note: with {ncpu} CPUs the single-threaded workload takes one and the daemon, its py-spy "
              "dumps, py-spy record and everything else on the box share the other: contention for CPU shows "
              "up in the ratios as well as the cost of being read")
    runs = measure(args.rounds, workloads, modes, out=lambda s: print(s, flush=True))
    print()
    print("\n".join(report(runs, workloads, modes)))
    print("  wall = the workload's own perf_counter from 'go' to done; cpu = its own process_time; "
          "ratio = median / median of bare; "
          "paired = median over rounds of run / the same round's bare run")
    print("  dumps/run = memagent status stack_dumps during the timed part (median, min..max); observer cpu = "
          "the daemon with its reaped py-spy children (or py-spy record) over the timed part, per workload wall")
    print("  off-cpu = the workload's wall - cpu (median): time it was runnable but not running, or blocked; "
          "csw v/i = its voluntary (blocked) / involuntary (preempted) context switches (medians)")
    print(f"  settle = from the workload's 'ready' to 'go' (median; at least {SETTLE:g} s in every mode, so that "
          "all modes start the work equally long after the process started)")
    print(f"  done in {time.monotonic() - started:.0f} s; {_load()} at end")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--workload":
        sys.exit(workload_main(sys.argv[2]))
    sys.exit(main())
