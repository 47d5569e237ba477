"""Part 15: does growth attribution name the code that allocates? Scenarios with known truth.

Each scenario is ``tests/attribution_target.py``: memory grows only in ``grow`` (10 MiB a
step). A real ``memagent daemon`` (default settings: ``--interval 0.5``, default stack
budget) watches the growing process from outside; after the last step and a second of
idling, ``memagent stack PID`` (a fresh dump) is read, and per run:

- **credit to grow**: the bytes that ``by_function`` credits to ``grow``, as a share of
  all the bytes it credits;
- **peak in grow**: whether the stack at peak (``at_peak``; its attributed thread, else
  any thread) has a ``grow`` frame; ``missed`` counts the runs where the daemon said it
  took no stack during the rise to the peak (``stack_at_peak_state``, v1.7);
- **credited**: the MiB credited to any site, against the truth (steps x 10 MiB).

Scenarios: ``single`` (one thread), ``spinner`` (and a pure-Python busy thread),
``compute`` (and a thread in GIL-holding C calls), ``numpy`` (pieces from a C extension),
``bursts`` (100 ms of growth every 2 s), ``pool`` (growth in a ``multiprocessing.Pool``
worker, the worker watched). Runs are interleaved round by round.

    .venv/bin/python bench/stack_attribution.py [--rounds N] [--scenarios single,pool] [--interval S]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from fleet import in_group  # noqa: E402
from stacks_overhead import Lines, _connect, _kill, find_py_spy  # noqa: E402
from tick_regularity import memagent_argv  # noqa: E402

TARGET = os.path.join(os.path.dirname(HERE), "tests", "attribution_target.py")
SCENARIOS = ("single", "spinner", "compute", "numpy", "bursts", "pool")
STEPS = {"single": 12, "spinner": 12, "compute": 12, "numpy": 12, "bursts": 4, "pool": 12}
STEP_MIB = 10
ROUNDS = 3
IDLE_AFTER = 1.0
MiB = 1024 * 1024


@dataclass
class Run:
    scenario: str
    share: float = 0.0
    credited_mib: float = 0.0
    truth_mib: float = 0.0
    peak_in_grow: bool = False
    peak_state: str | None = None
    top: str = ""
    error: str | None = None


def in_grow(dump: Any) -> bool:
    """Whether ``dump``'s attributed thread (any thread when none is named) is inside ``grow``."""
    if dump is None:
        return False
    chosen = dump.attributed()
    threads = [chosen] if chosen is not None else dump.threads
    return any(f.name == "grow" for t in threads for f in t.frames)


def judge(reply: Any, truth_bytes: int) -> Run:
    """The figures of one ``stack_ok`` reply (shared with tests/e2e/test_attribution_e2e.py)."""
    run = Run("")
    sites = reply.by_function
    total = sum(s.bytes for s in sites)
    grew = sum(s.bytes for s in sites if s.function == "grow" and s.filename.endswith("attribution_target.py"))
    run.share = grew / total if total else 0.0
    run.credited_mib, run.truth_mib = total / MiB, truth_bytes / MiB
    run.peak_state = getattr(reply, "stack_at_peak_state", None)
    run.peak_in_grow = in_grow(reply.at_peak)
    if sites:
        run.top = f"{sites[0].function} {100 * sites[0].bytes / total:.0f}%"
    return run


def run_one(scenario: str, py_spy: str, tmp: str, interval: float, extra: list[str]) -> Run:
    sock = os.path.join(tmp, "d.sock")
    err = open(os.path.join(tmp, "err"), "w+b")
    target = daemon = None
    client = None
    try:
        target = subprocess.Popen([sys.executable, TARGET, scenario, str(STEPS[scenario])], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=err, preexec_fn=in_group())
        assert target.stdin is not None and target.stdout is not None
        out = Lines(target.stdout)
        pid = int(out.wait_for(lambda s: s.startswith("ready"), 20).split()[1])
        daemon = subprocess.Popen([*memagent_argv(), "daemon", "--socket", sock, "--interval", str(interval),
                                   "--py-spy", py_spy, *extra], stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                  preexec_fn=in_group())
        client = _connect(sock, daemon)
        client.attach([pid])
        client.stack(pid)  # the first stack is there: growth from now on is the scenario's
        time.sleep(2 * interval)
        target.stdin.write(b"go\n")
        target.stdin.flush()
        out.wait_for(lambda s: s == "done", 120)
        time.sleep(IDLE_AFTER)
        reply = client.stack(pid)
        run = judge(reply, STEPS[scenario] * STEP_MIB * MiB)
        run.scenario = scenario
        return run
    except Exception as exc:  # noqa: BLE001 - reported in the table, the other runs go on
        err.seek(0)
        tail = err.read()[-300:].decode("utf-8", "replace").strip()
        return Run(scenario, error=f"{type(exc).__name__}: {exc}" + (f" [stderr: {tail}]" if tail else ""))
    finally:
        if client is not None:
            client.close()
        _kill(target)
        _kill(daemon)
        err.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(sock)


def report(runs: list[Run], scenarios: tuple[str, ...]) -> list[str]:
    lines = [f"{'scenario':<8} {'runs':>4} {'credit to grow':>15} {'(min..max)':>11} {'peak in grow':>12} "
             f"{'missed':>6} {'credited/truth MiB':>18}  top site (last run)"]
    hits = 0
    peaks = total_runs = 0
    for s in scenarios:
        ok = [r for r in runs if r.scenario == s and r.error is None]
        if not ok:
            lines.append(f"{s:<8} {0:>4}  (every run failed)")
            continue
        shares = [r.share for r in ok]
        med = statistics.median(shares)
        hits += med >= 0.7
        inside = sum(r.peak_in_grow for r in ok)
        peaks += inside
        total_runs += len(ok)
        missed = sum(r.peak_state == "missed" for r in ok)
        spread = f"{100 * min(shares):.0f}..{100 * max(shares):.0f}%"
        lines.append(f"{s:<8} {len(ok):>4} {100 * med:>14.0f}% {spread:>11} "
                     f"{inside:>6}/{len(ok):<5} {missed:>6} "
                     f"{statistics.median(r.credited_mib for r in ok):>8.0f}/{ok[0].truth_mib:<9.0f}  {ok[-1].top}")
    for r in runs:
        if r.error:
            lines.append(f"FAILED {r.scenario}: {r.error}")
    if total_runs:
        lines.append(f"targets: credit to grow >= 70% (median) in >= 5 of 6 scenarios: {hits} of {len(scenarios)}; "
                     f"stack at peak inside grow in >= 80% of runs: {peaks}/{total_runs} "
                     f"({100 * peaks / total_runs:.0f}%)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("daemon_args", nargs="*", help="more daemon flags, after --")
    args = parser.parse_args(argv)
    scenarios = tuple(s for s in SCENARIOS if s in args.scenarios.split(","))
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    py_spy = find_py_spy()
    if py_spy is None:
        print("  py-spy not found (pip install py-spy): skipped")
        return 0
    native = subprocess.run([sys.executable, "-c", "import numpy"], capture_output=True, check=False).returncode
    print(f"  daemon: memagent daemon --interval {args.interval:g} {' '.join(args.daemon_args)}; "
          f"{args.rounds} rounds; numpy scenario uses {'ctypes (no NumPy)' if native else 'NumPy'}")
    tmp = tempfile.mkdtemp(prefix="memagent-bench-attr-")
    runs: list[Run] = []
    started = time.monotonic()
    try:
        for i in range(args.rounds):
            these = [run_one(s, py_spy, tmp, args.interval, args.daemon_args) for s in scenarios]
            runs += these
            print(f"  round {i + 1}: " + "  ".join(
                f"{r.scenario} {'FAIL' if r.error else f'{100 * r.share:.0f}%/{int(r.peak_in_grow)}'}"
                for r in these), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print("\n".join(report(runs, scenarios)))
    print(f"  done in {time.monotonic() - started:.0f} s; reproduce: .venv/bin/python bench/stack_attribution.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
