"""Part 17: what a command line costs (issue 26): the CPU of ``memagent ls``, ``status`` and
``attach`` against ``python -c 'import psutil'``, and ``memagent run``'s own overhead.

- **CPU per call**: user + system time of the whole child (``RUSAGE_CHILDREN``), each
  command run ``--rounds`` times *interleaved* with the baseline (command, baseline,
  command, ...), so that a box whose speed drifts (other tenants on its two cores) moves
  both; the ratio is the median of the per-round ratios. The commands talk to a real
  daemon (``--interval 0.5``) watching 20 idle Python processes: ``ls`` lists them.
  Targets: at most 2x the baseline.
- **``memagent run -- python -c pass``**: its wall time against a bare ``python -c pass``,
  interleaved, median of the differences (target: at most 0.25 s on a quiet box); and with
  ``--hogs N`` (two CPU-bound spinners: a loaded CI runner), how many of ``--runs`` succeed
  (target: 20 of 20).

    .venv/bin/python bench/cli_cost.py [--rounds 15] [--runs 20] [--hogs 2]

``--tree DIR`` runs the same against another checkout's code (``DIR/agent``,
``DIR/protocol`` on ``PYTHONPATH``): the before of a change.

The measured tree is byte-compiled first, and the commands run without
``PYTHONDONTWRITEBYTECODE``: an installed package carries its bytecode, and a shell that
sets the variable would otherwise measure compiling every module of a fresh checkout
(about 25 ms of ``ls``).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fleet import Fleet, die_with_parent, stop_daemon, wait_listening

HERE = Path(__file__).resolve().parent


def child_cpu(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """CPU seconds (user + system) and wall seconds of one run of ``argv``, and its exit status."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    code = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env).returncode
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall, code


def interleaved(argv: list[str], base: list[str], env: dict[str, str], rounds: int) -> tuple[float, float, float]:
    """Median CPU of ``argv``, of ``base``, and the median of their per-round ratios."""
    ours, theirs, ratios = [], [], []
    for _ in range(rounds):
        a = child_cpu(argv, env)[0]
        b = child_cpu(base, env)[0]
        ours.append(a)
        theirs.append(b)
        ratios.append(a / b if b > 0 else float("inf"))
    return statistics.median(ours), statistics.median(theirs), statistics.median(ratios)


def run_overhead(env: dict[str, str], rounds: int) -> tuple[float, float]:
    """Median wall of ``memagent run -- python -c pass`` and of a bare ``python -c pass``."""
    gate, bare = [], []
    for _ in range(rounds):
        gate.append(child_cpu([sys.executable, "-m", "memagent.cli", "run", "--", sys.executable, "-c", "pass"],
                              env)[1])
        bare.append(child_cpu([sys.executable, "-c", "pass"], env)[1])
    return statistics.median(gate), statistics.median(bare)


def runs_under_hogs(env: dict[str, str], runs: int, hogs: int) -> tuple[int, list[str]]:
    """How many of ``runs`` ``memagent run -- python -c pass`` exit 0 beside ``hogs`` spinners."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=die_with_parent)
                for _ in range(hogs)]
    ok, failures = 0, []
    try:
        for _ in range(runs):
            r = subprocess.run([sys.executable, "-m", "memagent.cli", "run", "--", sys.executable, "-c", "pass"],
                               capture_output=True, text=True, env=env, timeout=300)
            if r.returncode == 0:
                ok += 1
            else:
                failures.append(f"exit {r.returncode}: {r.stderr.strip()[-200:]}")
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    return ok, failures


def byte_compiled(env: dict[str, str], tree: Path) -> dict[str, str]:
    """``env`` for commands that find ``tree``'s bytecode written, as an install leaves it."""
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    dirs = [str(tree / d) for d in ("agent", "protocol", "tui") if (tree / d).is_dir()]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *dirs], check=True, env=env, stdout=subprocess.DEVNULL)
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--hogs", type=int, default=2)
    ap.add_argument("--tree", help="another checkout whose code to measure")
    args = ap.parse_args()
    env = dict(os.environ)
    if args.tree:
        env["PYTHONPATH"] = os.pathsep.join(str(Path(args.tree) / d) for d in ("agent", "protocol", "tui"))
    env = byte_compiled(env, Path(args.tree) if args.tree else HERE.parent)
    tmp = Path(tempfile.mkdtemp(prefix="memagent-cli-bench-"))
    sock = str(tmp / "m.sock")
    fleet = Fleet(20, python=20)
    daemon = None
    try:
        fleet.start()
        daemon = subprocess.Popen([sys.executable, "-m", "memagent.cli", "daemon", "--socket", sock, "--interval",
                                   "0.5", "--no-stacks"], stderr=subprocess.PIPE, text=True,
                                  preexec_fn=die_with_parent, env=env, start_new_session=True)
        wait_listening(daemon)
        cli = [sys.executable, "-m", "memagent.cli", "--socket", sock]
        subprocess.run([*cli, "attach", *map(str, fleet.pids)], check=True, capture_output=True, env=env)
        base = [sys.executable, "-c", "import psutil"]
        print(f"CPU per call, median of {args.rounds} interleaved rounds (ratio: median of per-round ratios)")
        for name, extra in (("ls", ["ls"]), ("status", ["status"]), ("attach", ["attach", str(fleet.pids[0])]),
                            ("--help", ["--help"])):
            ours, theirs, ratio = interleaved([*cli, *extra], base, env, args.rounds)
            print(f"  memagent {name:8s} {ours * 1e3:6.1f} ms   import psutil {theirs * 1e3:5.1f} ms   "
                  f"ratio {ratio:4.2f}x   (target <= 2x)")
    finally:
        if daemon is not None:
            stop_daemon(daemon)
        fleet.stop()
    gate, bare = run_overhead(env, args.rounds)
    print(f"memagent run -- python -c pass: {gate:.3f} s wall, bare {bare:.3f} s: overhead {gate - bare:.3f} s "
          "(target <= 0.25 s on a quiet box)")
    if args.runs:
        ok, failures = runs_under_hogs(env, args.runs, args.hogs)
        print(f"memagent run -- python -c pass beside {args.hogs} CPU hogs: {ok} of {args.runs} succeeded "
              "(target: all)")
        for line in failures[:5]:
            print(f"  {line}")
    print(f"load average: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
