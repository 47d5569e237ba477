"""A controllable target process for end-to-end tests: commands on stdin, "ok ..." on stdout.

Commands: ``alloc MIB`` (allocate and touch, hold), ``free`` (release everything held),
``spike MIB`` (allocate, touch, release at once), ``fork`` (fork a child that sleeps and
report its pid), ``maxrss`` (report its own ``getrusage(RUSAGE_SELF).ru_maxrss``, in
bytes, as a program reporting its own peak does), ``exit``. Uses only the standard
library so that the system python3 can run it as another user.
"""

import gc
import os
import resource
import sys
import threading
import time

MiB = 1024 * 1024


def die_with_parent():
    """A forked child must not outlive the target: the tests kill the target with SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        os._exit(0)


def fork_sleeper():
    """A child that sleeps, sharing the parent's memory copy-on-write; returns its PID."""
    pid = os.fork()
    if pid == 0:
        os.close(0)
        die_with_parent()
        time.sleep(3600)
        os._exit(0)
    return pid


def main() -> None:
    held = []
    children = []
    leaking = []
    out = sys.stdout
    out.write(f"ok ready {os.getpid()}\n")
    out.flush()
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "alloc":
            held.append(bytearray(b"\x01") * (int(args[0]) * MiB))
            out.write("ok alloc\n")
        elif cmd == "free":
            leaking.clear()
            held.clear()
            gc.collect()
            out.write("ok free\n")
        elif cmd == "spike":
            burst = bytearray(b"\x01") * (int(args[0]) * MiB)
            del burst
            out.write("ok spike\n")
        elif cmd == "fork":
            pid = fork_sleeper()
            children.append(pid)
            out.write(f"ok fork {pid}\n")
        elif cmd == "leak":  # leak MIB_PER_S: grow steadily in a thread until told "free"
            rate = float(args[0])

            def leak(rate=rate):
                while leaking:
                    held.append(bytearray(b"\x01") * int(rate * MiB / 10))
                    time.sleep(0.1)

            leaking.append(True)
            threading.Thread(target=leak, daemon=True).start()
            out.write("ok leak\n")
        elif cmd == "share":  # share MIB N: hold MIB and fork N children that keep it shared
            held.append(bytearray(b"\x01") * (int(args[0]) * MiB))
            pids = [fork_sleeper() for _ in range(int(args[1]))]
            children.extend(pids)
            out.write("ok share " + " ".join(map(str, pids)) + "\n")
        elif cmd == "maxrss":
            out.write(f"ok maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}\n")
        elif cmd == "exit":
            out.write("ok exit\n")
            out.flush()
            break
        out.flush()
    for pid in children:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except OSError:
            pass


if __name__ == "__main__":
    main()
