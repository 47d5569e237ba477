"""What ``memagent run`` costs the command it watches: a 10 s workload (pure-Python work
plus allocations that move its RSS, so the agent samples, and dumps stacks on growth),
run bare and under ``memagent run --budget-rss 4GiB``, interleaved, ``--runs`` times each.
Printed: each wall time and the slowdown ratio (median under / median bare).

    python bench/run_overhead.py [--runs 3] [--seconds 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
WORKLOAD = """
import sys, time
rounds, end, held = 0, time.time() + {seconds}, []
while time.time() < end:
    rounds += 1
    for i in range(20000):
        i * i % 7
    held.append(bytearray(b"x") * (1 << 20))
    if len(held) > 200:
        held.clear()
print(rounds)
"""


def timed(argv: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, done.stdout.strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10.0)
    args = p.parse_args()
    code = WORKLOAD.format(seconds=args.seconds)
    bare_argv = [sys.executable, "-c", code]
    run_argv = [str(BIN / "memagent"), "run", "--budget-rss", "4GiB", "--", *bare_argv]
    bare: list[float] = []
    under: list[float] = []
    work_bare: list[int] = []
    work_under: list[int] = []
    for _ in range(args.runs):  # interleaved: drift of the box hits both alike
        t, out = timed(bare_argv)
        bare.append(t)
        work_bare.append(int(out))
        t, out = timed(run_argv)
        under.append(t)
        work_under.append(int(out.splitlines()[-1]))
    # The workload runs for a fixed time: the slowdown is the work it got done, not its wall time.
    ratio = statistics.median(work_bare) / statistics.median(work_under)
    print(f"{args.seconds:g} s workload, {args.runs} runs each, interleaved")
    print(f"  bare:               rounds {statistics.median(work_bare):>8,}  wall {statistics.median(bare):.2f} s")
    print(f"  under memagent run: rounds {statistics.median(work_under):>8,}  wall {statistics.median(under):.2f} s")
    print(f"  slowdown (work done bare / under memagent run): {ratio:.3f}x ({100 * (ratio - 1):+.1f} %)")
    print(f"  every run: bare {sorted(work_bare)}, under memagent run {sorted(work_under)}")
    extra = statistics.median(under) - statistics.median(bare)
    print(f"  memagent run's own start and stop: {extra:+.2f} s of wall time")


if __name__ == "__main__":
    main()
