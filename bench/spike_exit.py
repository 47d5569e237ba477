"""Spike-then-exit: how much of a short-lived process's peak the daemon keeps.

Each run starts ``tests/spike_exit.py``: it allocates and touches ``--mib`` MiB, writes its
own VmHWM to a file and exits, ~35 ms after it started. ``direct``: attached while it
waits on a pipe, then released. ``child``: run by a parent watched with ``--children``.
The daemon's peak (``memagent ls``) is compared with the process's own VmHWM: *lost* is
how much lower it is; *unseen*: the daemon never watched the child.

    python bench/spike_exit.py [--runs 10] [--mib 100] [--interval 0.5] [--no-netlink]
        [--src DIR]       # run the daemon from another checkout (e.g. `git archive` of HEAD)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from fleet import die_with_parent, in_group, stop_daemon, wait_listening

HERE = Path(__file__).resolve().parent
SPIKE = str(HERE.parent / "tests" / "spike_exit.py")


def _expect(proc: subprocess.Popen[str], word: str) -> str:
    assert proc.stdout is not None
    parts = proc.stdout.readline().split()
    if parts[:2] != ["ok", word]:
        raise RuntimeError(f"expected 'ok {word}', got {parts}")
    return parts[2]


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-S", SPIKE, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, bufsize=1, preexec_fn=die_with_parent)


def _settle(client: object, pid: int, ticks: int) -> None:
    """Let the daemon run ``ticks`` ticks (its exit detection and two /proc scans)."""
    from memproto.frames import Sample

    first = None
    for frame in client.stream():  # type: ignore[attr-defined]
        if isinstance(frame, Sample):
            first = frame.seq if first is None else first
            if frame.seq - first >= ticks:
                return


def run(args: argparse.Namespace) -> list[tuple[str, int, int | None, bool | None]]:
    from memagent.client import Client

    results: list[tuple[str, int, int | None, bool | None]] = []
    with tempfile.TemporaryDirectory(prefix="memagent-spike-") as tmp:
        sock = os.path.join(tmp, "d.sock")
        env = dict(os.environ)
        if args.src:
            env["PYTHONPATH"] = os.pathsep.join(f"{args.src}/{d}" for d in ("agent", "protocol"))
        cmd = [sys.executable, "-m", "memagent.cli", "daemon", "--socket", sock, "--interval", str(args.interval),
               "--no-gpu", "--no-stacks"] + (["--no-netlink"] if args.no_netlink else [])
        daemon = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True,
                                  preexec_fn=in_group())
        try:
            wait_listening(daemon)
            ticks = int(2.5 / args.interval) + 2
            with Client(sock, timeout=30) as c:
                c.subscribe()
                for mode in ("direct", "child"):
                    parent = _spawn("--parent") if mode == "child" else None
                    if parent is not None:
                        c.attach([int(_expect(parent, "ready"))], children=True)
                    for i in range(args.runs):
                        mark = os.path.join(tmp, f"{mode}{i}")
                        if parent is None:
                            target = _spawn("--wait", str(args.mib), mark)
                            pid = int(_expect(target, "ready"))
                            c.attach([pid])
                            assert target.stdin is not None
                            target.stdin.write("go\n")
                            target.stdin.flush()
                            target.wait()
                        else:
                            assert parent.stdin is not None
                            parent.stdin.write(f"{args.mib} {mark}\n")
                            parent.stdin.flush()
                            pid = int(_expect(parent, "child"))
                        _settle(c, pid, ticks)
                        own = int(Path(mark).read_text().split()[0])
                        info = {p.pid: p for p in c.list()}.get(pid)
                        results.append((mode, own, info.rss_peak_bytes if info else None,
                                        info.rss_peak_exact if info else None))
                        c.detach([], exited=True)
                    if parent is not None:
                        parent.kill()
                        parent.wait()
        finally:
            stop_daemon(daemon)  # type: ignore[arg-type]
    return results


def report(results: list[tuple[str, int, int | None, bool | None]], args: argparse.Namespace) -> list[str]:
    MiB = 1024 * 1024
    out = [f"spike-then-exit, {args.mib} MiB, interval {args.interval} s"
           f"{', --no-netlink' if args.no_netlink else ''}{', daemon from ' + args.src if args.src else ''}"]
    for mode in ("direct", "child"):
        rows = [r for r in results if r[0] == mode]
        cells = []
        lost = unseen = wrong_exact = 0
        worst = 0.0
        for _, own, peak, exact in rows:
            if peak is None:
                unseen += 1
                cells.append("unseen")
                continue
            loss = (own - peak) / own
            worst = max(worst, abs(loss))
            lost += loss > 0.01
            wrong_exact += bool(exact) and loss > 0.01
            cells.append(f"{peak / MiB:.0f}/{own / MiB:.0f}{'' if exact else '~'}")
        out.append(f"  {mode:<6} peak/own MiB (~ = not exact): {' '.join(cells)}")
        out.append(f"         lost > 1 %: {lost} of {len(rows) - unseen} seen, unseen: {unseen}, "
                   f"lost yet said exact: {wrong_exact}, largest |peak - own| / own: {worst:.1%}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--no-netlink", action="store_true")
    parser.add_argument("--src", help="a checkout whose agent/ and protocol/ the daemon runs from")
    args = parser.parse_args()
    print("\n".join(report(run(args), args)))


if __name__ == "__main__":
    main()
