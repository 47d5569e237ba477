"""How long Σ peaks stays off the truth after sharing changes that leave RSS alone.

Three scenarios (``tests/sharing_target.py``), each against a fresh real daemon at the
default settings:

* ``cow``: a parent holding ``--mib`` MiB and 3 forked workers (attached with children);
  the workers write one byte per page: the copy-on-write pages become their own;
* ``fork``: a process holding ``--mib`` MiB (attached with children) forks a child;
* ``shm``: a process maps a ``--mib`` MiB /dev/shm segment and is attached; a second,
  unrelated one maps the same segment and is attached.

After the change it polls the daemon's host Σ peaks and the truth (each process's VmHWM
minus its RSS - PSS, read from outside) every 0.1 s for ``--watch`` seconds and prints
Σ / truth at +1 s and +3 s and the last moment it was off by more than 10 %.

    .venv/bin/python bench/sharing_convergence.py [--mib 200] [--watch 35]
    # another checkout's daemon (before/after; the client is this one's):
    .venv/bin/python bench/sharing_convergence.py --src /tmp/old
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "agent"), str(ROOT / "protocol"), str(ROOT / "tests")]

from fleet import die_with_parent, wait_listening  # noqa: E402
from sharing_target import Controlled, truth  # noqa: E402

from memagent.client import Client  # noqa: E402

MiB = 1 << 20


def start_daemon(src: Path, sock: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{src / 'agent'}:{src / 'protocol'}"}
    d = subprocess.Popen([sys.executable, "-m", "memagent.cli", "daemon", "--socket", sock], env=env,
                         stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
    wait_listening(d)
    return d


def sum_peaks(c: Client) -> int:
    (host,) = c.status().headroom
    return host.sum_peaks_bytes


def watch(c: Client, pids: list[int], seconds: float) -> str:
    start = time.monotonic()
    last_off, at = 0.0, {}
    while (elapsed := time.monotonic() - start) <= seconds:
        got, want = sum_peaks(c), truth(pids)
        if abs(got - want) > 0.1 * want:
            last_off = elapsed
        for mark in (1.0, 3.0):
            if elapsed >= mark and mark not in at:
                at[mark] = f"{got / MiB:.0f}/{want / MiB:.0f} MiB ({got / want - 1:+.0%})"
        time.sleep(0.1)
    return (f"Σ/truth at +1 s {at.get(1.0)}, at +3 s {at.get(3.0)}; last off by >10 %: "
            + (f"{last_off:.1f} s" if last_off < seconds - 0.2 else f"still at +{seconds:g} s"))


def settle(c: Client, pids: list[int]) -> None:
    deadline = time.monotonic() + 40
    while abs(sum_peaks(c) - truth(pids)) > 0.1 * truth(pids) and time.monotonic() < deadline:
        time.sleep(0.1)


def scenario(name: str, c: Client, mib: int, seconds: float, tmp: Path) -> str:
    procs: list[Controlled] = []
    try:
        if name == "cow":
            t = Controlled("cow", str(mib), "3")
            procs.append(t)
            pids = [t.pid, *t.workers]
            c.attach([t.pid], children=True)
            settle(c, pids)
            t.do("write")
        elif name == "fork":
            t = Controlled("hold", str(mib))
            procs.append(t)
            c.attach([t.pid], children=True)
            settle(c, [t.pid])
            pids = [t.pid, int(t.do("fork")[0])]
        else:
            segment = f"/dev/shm/memagent-bench-{os.getpid()}"
            procs.append(Controlled("shm", segment, str(mib)))
            c.attach([procs[0].pid])
            settle(c, [procs[0].pid])
            procs.append(Controlled("shm", segment, str(mib)))
            c.attach([procs[1].pid])
            os.unlink(segment)
            pids = [p.pid for p in procs]
        return watch(c, pids, seconds)
    finally:
        for p in procs:
            p.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=200)
    ap.add_argument("--watch", type=float, default=35.0)
    ap.add_argument("--src", type=Path, default=ROOT, help="checkout whose daemon runs (default: this one)")
    args = ap.parse_args()
    print(f"Σ peaks after sharing changes: daemon of {args.src}, {args.mib} MiB, watched {args.watch:g} s")
    print(f"  reproduce: .venv/bin/python bench/sharing_convergence.py --mib {args.mib} --watch {args.watch:g}"
          + (f" --src {args.src}" if args.src != ROOT else ""))
    for name in ("cow", "fork", "shm"):
        tmp = Path(tempfile.mkdtemp(prefix="memagent-sharing-bench-"))
        sock = str(tmp / "m.sock")
        d = start_daemon(args.src, sock)
        try:
            with Client(sock) as c:
                print(f"  {name:5s} {scenario(name, c, args.mib, args.watch, tmp)}", flush=True)
        finally:
            d.terminate()
            d.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
