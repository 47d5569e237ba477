"""The watched processes of the benchmark: idle real processes in one process group.

``Fleet(n, python=20)`` starts ``python`` idle Python interpreters
(``python -c "import time; time.sleep(1e6)"`` with ``sys.executable``) and ``n - python``
``sleep 100000`` processes. All of them join one new process group (the first one leads
it), so :meth:`Fleet.stop` can kill them with a single ``killpg`` even when the
benchmark dies half-way; every child is then also killed and reaped one by one. Each
child also asks the kernel for SIGKILL when the benchmark itself dies (PR_SET_PDEATHSIG),
which covers a benchmark killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

PYTHON_IDLE = "import time; time.sleep(1e6)"
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """In the child before exec: SIGKILL when the benchmark dies, even by SIGKILL."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def in_group(pgid: int = 0) -> Callable[[], None]:
    """A ``preexec_fn``: join process group ``pgid`` (0: lead a new one), then
    :func:`die_with_parent`. (Popen's ``process_group=`` is Python 3.11's; the floor is 3.10.)"""

    def preexec() -> None:
        os.setpgid(0, pgid)
        die_with_parent()

    return preexec


class Fleet:
    def __init__(self, n: int, python: int = 20) -> None:
        self.n = n
        self.python = min(python, n)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.argv: dict[int, bytes] = {}
        self.pgid: int | None = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def __enter__(self) -> Fleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, argv: list[str]) -> None:
        p = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            # 0: lead a new group; later ones join the leader's group.
            preexec_fn=in_group(0 if self.pgid is None else self.pgid),
        )
        if self.pgid is None:
            self.pgid = p.pid
        self.procs.append(p)
        self.argv[p.pid] = b"\0".join(a.encode() for a in argv) + b"\0"

    def start(self, settle_timeout: float = 30.0) -> None:
        try:
            for i in range(self.n):
                if i < self.python:
                    self._spawn([sys.executable, "-c", PYTHON_IDLE])
                else:
                    self._spawn(["sleep", "100000"])
            self._wait_idle(settle_timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_idle(self, timeout: float) -> None:
        """Until every child has exec'd and sleeps, and the Pythons finished starting."""
        deadline = time.monotonic() + timeout
        pending = set(self.pids)
        while pending and time.monotonic() < deadline:
            for pid in list(pending):
                try:
                    with open(f"/proc/{pid}/stat", "rb") as f:
                        stat = f.read()
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmdline = f.read()
                except OSError:
                    raise RuntimeError(f"fleet process {pid} died while starting") from None
                state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
                if cmdline == self.argv[pid] and state == b"S":
                    pending.discard(pid)
            if pending:
                time.sleep(0.05)
        if pending:
            raise RuntimeError(f"{len(pending)} fleet processes did not settle within {timeout:g} s")
        # Python interpreters sleep briefly during start-up too: wait for stable statm.
        py = self.pids[: self.python]
        before = [_statm(p) for p in py]
        while time.monotonic() < deadline:
            time.sleep(0.2)
            after = [_statm(p) for p in py]
            if after == before:
                return
            before = after

    def stop(self) -> None:
        if self.pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        self.procs = []
        self.pgid = None


def stop_daemon(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """SIGTERM a daemon started in its own process group; kill the group if it lingers."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_listening(daemon: subprocess.Popen[str]) -> None:
    """Until the daemon (started with ``stderr=PIPE, text=True``) logs that it listens; then
    its log is drained in a thread, so a chatty daemon never blocks on a full pipe."""
    assert daemon.stderr is not None
    for line in daemon.stderr:
        if "listening on" in line:
            threading.Thread(target=daemon.stderr.read, daemon=True).start()
            return
    raise SystemExit(f"the daemon did not start (exit status {daemon.wait()})")


def proc_cpu(pid: int, children: bool = False) -> float:
    """CPU seconds of ``pid``, all its threads (utime + stime of /proc/PID/stat), and with
    ``children`` those of its reaped children too (a daemon's py-spy dumps)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15 if children else 13]) / os.sysconf("SC_CLK_TCK")


def _statm(pid: int) -> bytes:
    with open(f"/proc/{pid}/statm", "rb") as f:
        return f.read()


def proc_status_kb(pid: int | str, *keys: str) -> dict[str, int]:
    """``VmRSS``-style fields of ``/proc/PID/status``, in kB."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in keys:
                out[key] = int(value.split()[0])
    return out
