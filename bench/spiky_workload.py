"""A spiky model-like workload for bench/mprof_compare.py: a base of ``--base`` MiB that grows
slowly, and every ~``--every`` seconds a spike of 64-``--spike`` MiB held 5-30 ms once faulted
in (a batch's activations), for ``--seconds``. It prints its PID, waits for a line on stdin (the
bench attaches its watchers first), runs, then writes its own VmHWM (kB, the kernel's
peak: the truth both tools are compared with) and the spikes' times and sizes as JSON to
``--out``."""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

MiB = 1024 * 1024
PAGE = 4096


def touch(n: int) -> bytearray:
    buf = bytearray(n)
    for i in range(0, n, PAGE):  # fault every page in: RSS, not just address space
        buf[i] = 1
    return buf


def vm_hwm_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=float, default=12.0)
    p.add_argument("--base", type=int, default=80)
    p.add_argument("--spike", type=int, default=256)
    p.add_argument("--every", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    rng = random.Random(a.seed)
    print(f"pid {__import__('os').getpid()}", flush=True)
    sys.stdin.readline()
    base = [touch(a.base * MiB)]
    spikes = []
    start = time.time()
    while time.time() - start < a.seconds:
        time.sleep(a.every * rng.uniform(0.6, 1.4))
        size = rng.randint(64, a.spike) * MiB
        t0 = time.time()
        spike = touch(size)
        time.sleep(rng.uniform(0.005, 0.03))
        spikes.append({"time": t0, "held": time.time() - t0, "mib": size // MiB})
        del spike
        base.append(touch(2 * MiB))  # the slow growth under the spikes
    with open(a.out, "w") as f:
        json.dump({"vm_hwm_kb": vm_hwm_kb(), "spikes": spikes, "start": start, "end": time.time()}, f)


if __name__ == "__main__":
    main()
