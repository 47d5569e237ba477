"""A Python process with many threads whose memory keeps growing: what steers Austin's
cost (each of its threads is read at every sample) while bursts keep renewing (it grows).
Standard library only, so the system python3 runs it as another user.

Usage: ``threaded_grower.py THREADS``; prints ``ok ready PID`` once its threads run, then
grows 2 MiB every 50 ms, freeing all of it every 64 MiB, until killed."""

import os
import sys
import threading
import time

FOREVER = threading.Event()


def idle() -> None:
    FOREVER.wait()  # blocked without waking: Austin still reads the thread at each sample


def main() -> None:
    for _ in range(int(sys.argv[1])):
        threading.Thread(target=idle, daemon=True).start()
    sys.stdout.write(f"ok ready {os.getpid()}\n")
    sys.stdout.flush()
    held = []
    while True:
        held.append(bytearray(b"\x01") * (2 << 20))
        if len(held) >= 32:
            held.clear()
        time.sleep(0.05)


if __name__ == "__main__":
    main()
