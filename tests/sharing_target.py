"""Targets whose sharing changes while their RSS does not (the cases of issue 11).

``cow MIB N``: hold MIB of written memory, fork N workers that share it copy-on-write;
on the command ``write`` every worker writes one byte in each page (as Python's
reference counting does to the objects it touches): the pages become its own.
``shm PATH MIB``: map the file PATH (created at MIB if missing) shared and touch it.
``hold MIB``: hold MIB of written memory; on the command ``fork`` fork a child that
sleeps, sharing it copy-on-write.
Prints ``ok ready PID [WORKER...]``, then ``ok <command> [PID]`` per command; ``exit``
ends it. Standard library only, and :func:`truth`, what the tests and ``bench/`` compare
the daemon's Σ peaks with.
"""

import mmap
import os
import signal
import subprocess
import sys
from collections.abc import Callable

MiB = 1024 * 1024
PAGE = mmap.PAGESIZE


def die_with_parent() -> None:
    import ctypes

    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
    if os.getppid() == 1:
        os._exit(0)


def sleeper() -> None:
    die_with_parent()
    os.close(0)
    while True:
        signal.pause()


def worker(buf: bytearray, go: int, done: int) -> None:
    die_with_parent()
    while os.read(go, 1):
        for i in range(0, len(buf), PAGE):
            buf[i] = 2
        os.write(done, b"w")
    os._exit(0)


def cow(mib: int, n: int) -> list[int]:
    buf = bytearray(b"\x01") * (mib * MiB)
    done_r, done_w = os.pipe()
    gos, pids = [], []
    for _ in range(n):
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            worker(buf, go_r, done_w)
        gos.append(go_w)
        pids.append(pid)
    def write() -> str:
        for g in gos:
            os.write(g, b"g")
        for _ in gos:
            os.read(done_r, 1)
        return ""

    commands["write"] = write
    return pids


def hold(mib: int) -> list[int]:
    held.append(bytearray(b"\x01") * (mib * MiB))

    def fork() -> str:
        pid = os.fork()
        if pid == 0:
            sleeper()
        return str(pid)

    commands["fork"] = fork
    return []


def shm(path: str, mib: int) -> list[int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    if os.fstat(fd).st_size < mib * MiB:
        os.ftruncate(fd, mib * MiB)
    m = mmap.mmap(fd, mib * MiB)
    for i in range(0, mib * MiB, PAGE):
        m[i] = 1
    held.append(m)
    return []


def _kib(text: str, key: str) -> int:
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def truth(pids: list[int]) -> int:
    """Σ over the processes of VmHWM - (RSS - PSS), read now from outside: what Σ peaks
    should be (each process's peak, its shared pages counted once in all)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            rollup = f.read()
        with open(f"/proc/{pid}/status") as f:
            hwm = _kib(f.read(), "VmHWM")
        total += hwm - (_kib(rollup, "Rss") - _kib(rollup, "Pss"))
    return total


class Controlled:
    """This script run as a child and driven over its pipes (the tests, and
    ``bench/sharing_convergence.py``): ``pid``, ``workers``, :meth:`do` a command."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline().split()
        assert ready[:2] == ["ok", "ready"], ready
        self.pid, *self.workers = (int(p) for p in ready[2:])

    def do(self, command: str) -> list[str]:
        """Run ``command``; what its ``ok`` line says after the command's name."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().split()
        assert reply[:2] == ["ok", command], reply
        return reply[2:]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


commands: dict[str, Callable[[], str]] = {}
held: list[object] = []

if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "cow":
        workers = cow(int(args[0]), int(args[1]))
    elif mode == "shm":
        workers = shm(args[0], int(args[1]))
    else:
        workers = hold(int(args[0]))
    print("ok ready", os.getpid(), *workers, flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "exit":
            break
        print("ok", cmd, commands[cmd](), flush=True)
