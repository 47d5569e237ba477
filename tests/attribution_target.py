"""Targets whose memory grows in one known function, ``grow``: the known truth that growth
attribution is measured against (tests/e2e/test_attribution_e2e.py, bench/stack_attribution.py).

    python attribution_target.py SCENARIO STEPS

prints ``ready PID`` (the PID whose memory grows: a pool worker's in ``pool``), waits for a
line ``go`` on stdin, runs STEPS steps, each adding 10 MiB in ``grow`` (ten 1 MiB pieces,
each written and then checked in a Python loop, about 50 ms a step), prints ``done`` and
then idles in ``idle`` (``time.sleep``) until stdin closes. Between steps the growing
thread idles too (``idle``). Scenarios:

- ``single``: one thread; 0.3 s idle between steps.
- ``spinner``: and a second thread spinning in a pure-Python loop (``spin``).
- ``compute``: and a second thread in C calls that hold the GIL for ~10 ms each
  (``compute``: ``sorted`` of a 200 000-item list).
- ``numpy``: the pieces are NumPy arrays (``np.ones``, then ``np.cumsum`` over them):
  memory allocated inside a C extension. Without NumPy, ``ctypes`` buffers stand in
  (``ctypes.create_string_buffer``, then ``ctypes.memset``): the first line says which.
- ``bursts``: 100 ms of growth (10 MiB, slower pieces) every 2 s.
- ``pool``: ``grow`` runs in the worker process of a ``multiprocessing.Pool(1)``, which
  keeps the pieces; the parent only waits for it.

Standard library only, but for NumPy where it is installed.
"""

import os
import sys
import threading
import time

MiB = 1024 * 1024
STEP_MIB = 10
kept = []
stop = threading.Event()

#: Python-loop iterations per 1 MiB piece: about 50 ms a step, 100 ms in ``bursts``.
STEP_WORK, BURST_WORK = 40_000, 70_000

try:
    import numpy as np
except ImportError:  # stand-in: memory from a C call, as NumPy's
    import ctypes

    np = None


def grow(piece_work, native=False):
    """Adds STEP_MIB MiB, a piece at a time, spending CPU on each piece as real code does.
    ``native``: the pieces are allocated inside a C extension (NumPy, else ctypes)."""
    total = 0
    for _ in range(STEP_MIB):
        if not native:
            block = bytearray(b"\x01") * MiB
        elif np is not None:
            block = np.ones(MiB // 8)
            total += int(np.cumsum(block)[-1])
        else:
            block = ctypes.create_string_buffer(MiB)
            ctypes.memset(block, 1, MiB)
        view = memoryview(block).cast("B")
        for i in range(piece_work):
            total += view[(i * 4099) % MiB]
        kept.append(block)
    return total


def idle(seconds):
    time.sleep(seconds)


def spin():
    n = 0
    while not stop.is_set():
        n += 1
    return n


def compute():
    data = list(range(200_000, 0, -1))
    while not stop.is_set():
        sorted(data)


def _pid():
    return os.getpid()


def run(scenario, steps):
    if scenario in ("spinner", "compute"):
        threading.Thread(target=spin if scenario == "spinner" else compute, name=scenario, daemon=True).start()
    pause, work = (2.0, BURST_WORK) if scenario == "bursts" else (0.3, STEP_WORK)
    for _ in range(steps):
        grow(work, native=scenario == "numpy")
        idle(pause)


def main():
    scenario, steps = sys.argv[1], int(sys.argv[2])
    pool = None
    if scenario == "pool":
        import multiprocessing

        pool = multiprocessing.get_context("fork").Pool(1)
        pid = pool.apply(_pid)
    else:
        pid = os.getpid()
    native = "numpy" if np is not None else "ctypes"
    sys.stdout.write(f"ready {pid} {native}\n")
    sys.stdout.flush()
    if sys.stdin.readline().strip() != "go":
        return
    if pool is not None:
        pool.apply(run, ("single", steps))
    else:
        run(scenario, steps)
    sys.stdout.write("done\n")
    sys.stdout.flush()
    stop.set()
    while sys.stdin.readline():
        idle(0.1)
    if pool is not None:
        pool.terminate()


if __name__ == "__main__":
    main()
