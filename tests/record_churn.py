"""A process whose memory changes all the time, and ``N - 1`` forked copies: a load for the
flight recorder's tests (tests/e2e/test_recorder.py), where every watched row changes at
every tick.

    python record_churn.py N PERIOD

Each process holds a mapping of a random size (64 to 1024 KiB, touched, so its RSS
follows) and replaces it every PERIOD seconds (mmap and munmap themselves: malloc would
keep a freed buffer in its heap after a few rounds, and the RSS would stop moving). The
first line on stdout is the PIDs, then it runs until killed; the copies die with the first
process (PR_SET_PDEATHSIG). Standard library only.
"""

import ctypes
import mmap
import os
import random
import sys
import time

KiB = 1024


def churn(period: float) -> None:
    rnd = random.Random(os.getpid())
    while True:
        size = rnd.randrange(64, 1024) * KiB
        held = mmap.mmap(-1, size)
        held.write(b"\x01" * size)
        time.sleep(period)
        held.close()


def main() -> None:
    n, period = int(sys.argv[1]), float(sys.argv[2])
    pids = [os.getpid()]
    for _ in range(n - 1):
        pid = os.fork()
        if pid == 0:
            ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
            if os.getppid() == 1:
                os._exit(0)
            churn(period)
        pids.append(pid)
    print(" ".join(map(str, pids)), flush=True)
    churn(period)


if __name__ == "__main__":
    main()
