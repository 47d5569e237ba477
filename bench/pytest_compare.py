"""memagent's pytest plugin against the anchor, pytest-memray, on one sample suite
(``bench/pytest_suite``: one kind of allocation per test, 150 MiB each but a 10 MiB control).

1. Overhead: the suite run bare (both plugins installed, neither asked), with ``--memagent``
   and with ``--memray``, interleaved (the order rotates each round): the wall time of the
   whole pytest run, start-up included, and its CPU time (pytest and its children, user +
   system: it moves less with the box's other load), each as a ratio to the bare run of the
   same round (median, and the range over the rounds).
2. What memagent's per-test work costs, in this process: the reset of the high-water mark
   and the two reads of ``/proc/self`` (statm, status) at the start, one read at the end.
3. What each reports and what each catches: per test, memagent's peak RSS and growth (its
   ``--memagent`` summary), memray's heap high-water mark (its report), and which tests the
   same budget fails as ``memory_budget`` (peak RSS, pytest's own RSS included),
   ``memory_budget(growth=True)`` and memray's ``limit_memory`` (results from --junitxml).

    python bench/pytest_compare.py [--rounds 7] [--budget-mib 100]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE / "pytest_suite"
MiB = 1 << 20
MODES = {"bare": [], "--memagent": ["--memagent", "--memagent-top", "100"],
         "--memray": ["--memray", "--most-allocations=0"]}
MARKS = ("memory_budget", "memory_budget-growth", "limit_memory")
#: A row of memagent's summary: PEAK GROWTH EXACT TEST.
MEMAGENT_ROW = re.compile(r"^\s*([\d.]+ ?[KMG]?i?B)\s+([\d.]+ ?[KMG]?i?B)\s+(?:yes|no)\s+\S+::(\S+)$")
MEMRAY_TEST = re.compile(r"^Allocation results for \S+::(\S+) at the high watermark")
MEMRAY_TOTAL = re.compile(r"Total memory allocated: ([\d.]+)\s*([KMGT]?i?B)")
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_suite(extra: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stdout) of one pytest run of the suite, from its own root.
    The CPU time (user + system, pytest and its children) moves less than the wall time
    with what else the box runs."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore", *extra]
    cpu0, t0 = _children_cpu(), time.perf_counter()
    done = subprocess.run(argv, cwd=SUITE, capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=600)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if done.returncode not in (0, 1):  # 1: tests failed, as the catch runs mean them to
        raise SystemExit(f"pytest {' '.join(extra)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr}")
    return wall, cpu, done.stdout


def size(text: str, unit: str = "") -> float:
    """Bytes from ``150 MiB``, ``150.0MiB`` (memray) or ``512B``."""
    m = re.fullmatch(r"([\d.]+)\s*([KMGT]?i?B)", (text + unit).strip())
    if m is None:
        raise ValueError(f"not a size: {text + unit!r}")
    return float(m.group(1)) * UNITS[m.group(2)]


def memagent_figures(out: str) -> dict[str, tuple[float, float]]:
    """test name -> (peak, growth) from memagent's summary."""
    rows = {}
    for line in out.splitlines():
        m = MEMAGENT_ROW.match(line)
        if m:
            rows[m.group(3)] = (size(m.group(1)), size(m.group(2)))
    return rows


def memray_figures(out: str) -> dict[str, float]:
    """test name -> heap bytes at memray's high-water mark, from its report."""
    found: dict[str, float] = {}
    test = None
    for line in out.splitlines():
        if m := MEMRAY_TEST.match(line):
            test = m.group(1)
        elif (m := MEMRAY_TOTAL.search(line)) and test is not None:
            found[test] = size(m.group(1), m.group(2))
            test = None
    return found


def verdicts(mark: str, budget_mib: int) -> dict[str, str]:
    """test name -> pass / FAIL / skip / error with this marker on every test."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        run_suite([f"--junitxml={junit}"], {"BENCH_BUDGET_MARK": mark, "BENCH_BUDGET_MIB": str(budget_mib)})
        result = {}
        for case in ET.parse(junit).iter("testcase"):
            kinds = {child.tag for child in case}
            result[case.get("name", "?")] = ("FAIL" if "failure" in kinds else "error" if "error" in kinds
                                             else "skip" if "skipped" in kinds else "pass")
        return result


def reset_cost(rounds: int = 3000) -> str:
    """Microseconds per test of what the plugin does to this process's /proc files."""
    from memagent.proc.procfs import ProcFS

    handle = ProcFS().open(os.getpid())
    parts = []
    for _ in range(rounds):  # warm: the first calls pay for caches
        handle.clear_refs()
    for ballast_mib in (0, 512):
        ballast = b"x" * (ballast_mib * MiB)
        t0 = time.perf_counter()
        for _ in range(rounds):
            handle.clear_refs()
            handle.memory()
            handle.memory()
        per = (time.perf_counter() - t0) / rounds * 1e6
        _, memory = handle.memory()
        parts.append(f"{per:.1f} us at {(memory.rss_bytes or 0) / MiB:.0f} MiB RSS")
        del ballast
    handle.close()
    return ", ".join(parts)


def spread(values: list[float], unit: str = "") -> str:
    return f"{statistics.median(values):.2f}{unit} median ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--budget-mib", type=int, default=100)
    args = p.parse_args()
    names = list(MODES)
    walls: dict[str, list[float]] = {name: [] for name in names}
    cpus: dict[str, list[float]] = {name: [] for name in names}
    outputs: dict[str, str] = {}
    run_suite([])  # warm the page cache and the bytecode caches: the first run is not a round
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            wall, cpu, out = run_suite(MODES[name])
            walls[name].append(wall)
            cpus[name].append(cpu)
            outputs.setdefault(name, out)
    print(f"memagent {version('memagent')} (pytest --memagent) against pytest-memray {version('pytest-memray')} "
          f"(--memray, memray {version('memray')}), pytest {version('pytest')}, on bench/pytest_suite")
    print(f"1. overhead: a whole pytest run of the suite (start-up included), {args.rounds} rounds interleaved; "
          f"ratio to the bare run of the same round")
    for label, times in (("wall time", walls), ("CPU time (user + system)", cpus)):
        print(f"   {label}")
        for name in names:
            ratios = [w / b for w, b in zip(times[name], times["bare"], strict=True)]
            ratio = "" if name == "bare" else f"   x{spread(ratios)}"
            print(f"     {name:<11} {spread(times[name], ' s')}{ratio}")
    print(f"2. memagent's work per test (reset of VmHWM, 2 reads at the start, 1 at the end): {reset_cost()}")
    print(f"3. what each reports, and what the same budget ({args.budget_mib} MiB) on every test fails")
    found = {mark: verdicts(mark, args.budget_mib) for mark in MARKS}
    ours, theirs = memagent_figures(outputs["--memagent"]), memray_figures(outputs["--memray"])
    head = ("memory_budget", "growth=True", "limit_memory")
    print(f"   {'test':<22} {'RSS peak':>9} {'RSS growth':>10} {'memray heap':>11}   "
          + "  ".join(f"{h:<13}" for h in head))
    for test in found["memory_budget"]:
        peak, growth = ours.get(test, (float("nan"), float("nan")))
        heap = theirs.get(test, float("nan"))
        cells = "  ".join(f"{found[mark].get(test, '?'):<13}" for mark in MARKS)
        print(f"   {test:<22} {peak / MiB:>5.0f} MiB {growth / MiB:>6.0f} MiB {heap / MiB:>7.1f} MiB   {cells}")
    print("   RSS: the pytest process's resident memory (memagent: kernel high-water mark over setup + call); "
          "memray heap: bytes allocated and not freed at its high-water mark (call only)")
    print(f"reproduce: cd {HERE.parent} && {sys.executable} bench/pytest_compare.py --rounds {args.rounds}")


if __name__ == "__main__":
    main()
