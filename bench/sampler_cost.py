"""What a stack sample costs: one ``py-spy dump`` per sample against a long-lived
``py-spy record`` (both ``--nonblocking``) and Austin (``austin -f``, what the daemon's
bursts run), on the ``spinner`` target of tests/attribution_target.py. The figures behind
the sampler choice in docs/stacks.md.

    .venv/bin/python bench/sampler_cost.py [--dumps 20] [--seconds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from stacks_overhead import find_py_spy  # noqa: E402

AUSTIN = os.path.join(os.path.dirname(sys.executable), "austin")

TARGET = os.path.join(os.path.dirname(HERE), "tests", "attribution_target.py")


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dumps", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    spy = find_py_spy()
    if spy is None:
        print("  py-spy not found: skipped")
        return 0
    target = subprocess.Popen([sys.executable, TARGET, "spinner", "1000"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdin is not None and target.stdout is not None
        pid = target.stdout.readline().split()[1]
        target.stdin.write("go\n")
        target.stdin.flush()
        time.sleep(0.5)
        c0, t0 = children_cpu(), time.perf_counter()
        for _ in range(args.dumps):
            subprocess.run([spy, "dump", "--pid", pid, "--nonblocking", "--json"], capture_output=True, check=False)
        cpu, wall = (children_cpu() - c0) / args.dumps, (time.perf_counter() - t0) / args.dumps
        print(f"  py-spy dump --nonblocking --json: {1000 * cpu:.1f} ms CPU, {1000 * wall:.1f} ms wall a sample "
              f"({args.dumps} dumps); at 10 a second: {100 * 10 * cpu:.0f}% of a core")
        with tempfile.TemporaryDirectory() as tmp:
            for fmt in ("raw", "chrometrace"):
                out = os.path.join(tmp, f"rec.{fmt}")
                c0 = children_cpu()
                r = subprocess.run([spy, "record", "--pid", pid, "--nonblocking", "--idle", "--rate", "100",
                                    "--duration", f"{args.seconds:g}", "--format", fmt, "--output", out],
                                   capture_output=True, text=True, check=False)
                cpu = children_cpu() - c0
                found = re.search(r"Samples: (\d+)", r.stdout)
                samples = found.group(1) if found else "?"
                print(f"  py-spy record --nonblocking --rate 100 --format {fmt}, {args.seconds:g} s: "
                      f"{1000 * cpu:.0f} ms CPU = {100 * cpu / args.seconds:.1f}% of a core "
                      f"({samples} samples reported; output written only at the end)")
        if os.access(AUSTIN, os.X_OK):
            c0 = children_cpu()
            r = subprocess.run([AUSTIN, "-f", "-P", "-i", "10ms", "-x", f"{max(1, round(args.seconds))}", "-p", pid],
                               capture_output=True, text=True, check=False)
            cpu = children_cpu() - c0
            samples = sum(1 for line in r.stdout.splitlines() if line.startswith("P"))
            print(f"  austin -f -i 10ms, {args.seconds:g} s: {1000 * cpu:.0f} ms CPU = "
                  f"{100 * cpu / args.seconds:.1f}% of a core ({samples} thread samples, streamed as taken)")
        else:
            print(f"  austin: not found beside {sys.executable} (pip install 'austin-dist<4')")
    finally:
        target.kill()
        target.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
