"""Latency from the start of a steady leak to the daemon's ``leak`` alert, end to end.

A real daemon (default interval and ``[alerts]``, ``[host] capacity`` as given: the box of
the issue, 24 GiB) watches a real target (``tests/target_proc.py``, ``leak RATE``: it
appends RATE/10 MiB every 0.1 s); a subscribed client notes when the first firing
``leak`` alert about it arrives. Latency = that moment minus the moment the target
acknowledged the ``leak`` command. Prints the latency, what the target held then, and
the alert's message. The target is killed at the alert or at ``--timeout``.

    .venv/bin/python bench/leak_latency.py --rate 20            # MiB/s
    .venv/bin/python bench/leak_latency.py --rate 1 --timeout 700
    # another checkout's daemon (e.g. before a change; the client is this one's):
    .venv/bin/python bench/leak_latency.py --rate 20 --src /tmp/old

The target grows by RATE times the latency: at 20 MiB/s about 0.5 GiB; mind the box's memory
when running an older daemon with a long ``--timeout``.
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
sys.path[:0] = [str(ROOT / "agent"), str(ROOT / "protocol"), str(ROOT / "tests")]

from memagent.client import Client  # noqa: E402
from memproto.frames import AlertRaised  # noqa: E402


def measure(rate: float, capacity: str, timeout: float, src: Path | None) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="memagent-leak-bench-"))
    cfg, sock = tmp / "m.toml", tmp / "m.sock"
    cfg.write_text(f'[host]\ncapacity = "{capacity}"\n')
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = f"{src / 'agent'}:{src / 'protocol'}"
    daemon = subprocess.Popen([sys.executable, "-m", "memagent.cli", "daemon", "--config", str(cfg),
                               "--socket", str(sock), "--no-stacks"], stderr=subprocess.DEVNULL, env=env)
    target = subprocess.Popen([sys.executable, str(ROOT / "tests" / "target_proc.py")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, bufsize=1)
    try:
        assert target.stdin is not None and target.stdout is not None
        target.stdout.readline()  # ok ready
        deadline = time.monotonic() + 15
        while not sock.exists():
            assert time.monotonic() < deadline, "daemon did not start"
            time.sleep(0.02)
        with Client(str(sock), timeout=timeout + 30) as c:
            c.attach([target.pid])
            c.subscribe()
            time.sleep(5)  # some steady history first
            target.stdin.write(f"leak {rate:g}\n")
            target.stdin.flush()
            target.stdout.readline()  # ok leak
            started = time.monotonic()
            for frame in c.stream():
                late = time.monotonic() - started
                if isinstance(frame, AlertRaised) and frame.alert.kind == "leak" and frame.alert.state == "firing" \
                        and frame.alert.pid == target.pid:
                    held = int(Path(f"/proc/{target.pid}/status").read_text().split("VmRSS:")[1].split()[0]) // 1024
                    print(f"leak {rate:g} MiB/s, capacity {capacity}: alert after {late:.1f} s "
                          f"(target RSS {held} MiB, severity {frame.alert.severity})\n  {frame.alert.message}")
                    return 0
                if late > timeout:
                    break
        print(f"leak {rate:g} MiB/s, capacity {capacity}: no alert within {timeout:g} s")
        return 1
    finally:
        target.kill()
        target.wait()
        daemon.terminate()
        daemon.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=20.0, help="MiB per second (default 20)")
    ap.add_argument("--capacity", default="24GiB", help="[host] capacity (default 24GiB)")
    ap.add_argument("--timeout", type=float, default=200.0, help="seconds to wait for the alert (default 200)")
    ap.add_argument("--src", type=Path, help="run the daemon of this checkout instead (its agent/ and protocol/)")
    args = ap.parse_args()
    return measure(args.rate, args.capacity, args.timeout, args.src)


if __name__ == "__main__":
    sys.exit(main())
