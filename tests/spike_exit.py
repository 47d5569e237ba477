"""A process that spikes and exits at once, for tests/e2e/test_process_events.py.

``spike_exit.py MIB OUT``: allocate and touch MIB MiB, write its own VmHWM (bytes) and how
long it lived (seconds, from its start, to 10 ms) to the file OUT, exit at once
(``os._exit``: no teardown). With ``--wait`` first it says ``ok ready PID`` and blocks
until a line arrives on stdin (the test attaches it meanwhile).

``spike_exit.py --parent``: says ``ok ready PID``; then, for each line ``MIB OUT`` on stdin,
runs ``spike_exit.py MIB OUT`` as its child (``subprocess``: vfork and exec), waits for
it and says ``ok child PID``. Standard library only.
"""

import os
import sys


def lifetime() -> float:
    """Seconds since this process started (its start time is in clock ticks after boot)."""
    with open("/proc/self/stat", "rb") as f:
        start_ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
    with open("/proc/uptime", "rb") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def spike(mib: int, out_path: str) -> None:
    out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    status = os.open("/proc/self/status", os.O_RDONLY)
    block = b"\x01" * (mib << 20)  # allocated and written: resident
    text = os.pread(status, 8192, 0)
    hwm = int(text.split(b"VmHWM:")[1].split()[0]) * 1024
    os.write(out, f"{hwm} {lifetime():.3f}\n".encode())
    del block
    os._exit(0)


def parent() -> None:
    import subprocess

    print(f"ok ready {os.getpid()}", flush=True)
    for line in sys.stdin:
        mib, out_path = line.split()
        child = subprocess.Popen([sys.executable, "-S", os.path.abspath(__file__), mib, out_path])
        child.wait()
        print(f"ok child {child.pid}", flush=True)


def main() -> None:
    args = sys.argv[1:]
    if args == ["--parent"]:
        parent()
        return
    if args[0] == "--wait":
        print(f"ok ready {os.getpid()}", flush=True)
        sys.stdin.readline()
        args = args[1:]
    spike(int(args[0]), args[1])


if __name__ == "__main__":
    main()
