"""One bursty, model-like Python process for bench/fleet_cost.py: memory that rises and falls.

Each cycle it allocates ``--mib`` MiB in ten steps (faulting every page in, as a batch's
activations do), holds the top briefly, frees it all, and rests, for a cycle of
``--period`` seconds; ``--threads`` worker threads spin on small allocations meanwhile
(an inference server's request threads: they make stack samplers' work grow with the
thread count). It runs until killed. It uses the standard library only.
"""

from __future__ import annotations

import argparse
import threading
import time

MiB = 1024 * 1024
PAGE = 4096


def touch(n: int) -> bytearray:
    buf = bytearray(n)
    for i in range(0, n, PAGE):  # fault every page in: resident memory, not address space
        buf[i] = 1
    return buf


def worker(stop: threading.Event) -> None:
    """A request thread: a little Python work and a short sleep, forever."""
    while not stop.is_set():
        junk = [str(i) for i in range(200)]
        del junk
        time.sleep(0.01)


def sawtooth(mib: int, period: float) -> None:
    """Rise over ~half the period in ten steps, hold, fall at once, rest the remainder."""
    held: list[bytearray] = []
    step = mib * MiB // 10
    rise = period / 2
    for _ in range(10):
        held.append(touch(step))
        time.sleep(rise / 10)
    time.sleep(period / 8)
    held.clear()
    time.sleep(max(0.0, period - rise - period / 8))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--period", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    stop = threading.Event()
    for _ in range(a.threads):
        threading.Thread(target=worker, args=(stop,), daemon=True).start()
    base = touch(40 * MiB)  # the model's weights: a steady base under the sawtooth
    while True:
        sawtooth(a.mib, a.period)
    del base


if __name__ == "__main__":
    main()
