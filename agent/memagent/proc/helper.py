"""A helper program (py-spy, Austin) run by the daemon and reaped by it, so that what it
cost is known: the CPU of a run, from the kernel's own account of it.

asyncio's subprocesses are reaped by its child watcher with ``waitpid``, which throws the
child's resource usage away; a short py-spy dump (~15 ms) ends before any read of its
``/proc/PID/stat`` could see it. Here each helper is reaped by ``os.wait4`` in a thread of
its own (what asyncio's default watcher does, with ``waitpid``), and its user + system time
is the ``rusage`` that call returns: exact, whatever the run's length. A long run (an
Austin burst) is also read while it runs (:meth:`Helper.poll_cpu`, its ``/proc/PID/stat``),
so that a budget can stop it before it ends; what was charged live is subtracted at reap.

Every CPU second is reported to ``charge(own, helper)``: ``own`` the daemon's own thread
time of starting the helper (the fork), ``helper`` the child's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

#: ``charge(own_seconds, helper_seconds)``: where the CPU of a helper is accounted.
Charge = Callable[[float, float], None]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def no_charge(own: float, helper: float) -> None:
    """A ``Charge`` that keeps nothing (tests, callers without a budget)."""


def stat_cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a live process of ours has used so far, from its
    ``/proc/PID/stat``; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        fields = data[data.rfind(b")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return None


class Helper:
    """One running helper: its output as asyncio streams, its exit and its CPU."""

    def __init__(self, popen: subprocess.Popen[bytes], stdout: asyncio.StreamReader, stderr: asyncio.StreamReader,
                 transports: list[asyncio.BaseTransport], charge: Charge) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdout = stdout
        self.stderr = stderr
        self._transports = transports
        self._charge = charge
        self.returncode: int | None = None
        #: The child's CPU seconds (user + system), from ``wait4`` once reaped.
        self.cpu_seconds: float | None = None
        #: What :meth:`poll_cpu` charged while it ran (subtracted from the total at reap).
        self.charged = 0.0
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def _reaped(self, status: int, usage: float) -> None:
        """In the loop: the child was reaped (``status`` from ``wait4``, ``usage`` its CPU)."""
        self.returncode = os.waitstatus_to_exitcode(status)
        self._popen.returncode = self.returncode  # subprocess never waits for it itself
        self.cpu_seconds = usage
        self._charge(0.0, max(0.0, usage - self.charged))
        self.charged = usage
        if not self._exited.done():
            self._exited.set_result(self.returncode)

    def poll_cpu(self) -> float:
        """Charge the CPU used since the last poll (its ``/proc/PID/stat``); returns it."""
        if self.returncode is not None:
            return 0.0
        now = stat_cpu_seconds(self.pid)
        if now is None or now <= self.charged:
            return 0.0
        delta, self.charged = now - self.charged, now
        self._charge(0.0, delta)
        return delta

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    async def communicate(self) -> tuple[bytes, bytes]:
        """Both outputs to their end, then the exit."""
        out, err = await asyncio.gather(self.stdout.read(), self.stderr.read())
        await self.wait()
        return out, err

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, 9)

    def close(self) -> None:
        """Close our ends of its pipes (what is left unread is thrown away)."""
        for transport in self._transports:
            transport.close()


async def spawn(argv: Sequence[str], charge: Charge, env: dict[str, str] | None = None,
                preexec_fn: Callable[[], None] | None = None, limit: int = 2 ** 16) -> Helper:
    """Start ``argv`` with stdin from /dev/null and stdout and stderr piped to us; raises
    OSError when it cannot start. Reaped by ``os.wait4`` in a thread (see the module doc)."""
    loop = asyncio.get_running_loop()
    started = time.thread_time()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        popen = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w, env=env,
                                 preexec_fn=preexec_fn)
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    charge(time.thread_time() - started, 0.0)
    streams: list[asyncio.StreamReader] = []
    transports: list[asyncio.BaseTransport] = []
    for fd in (out_r, err_r):
        reader = asyncio.StreamReader(limit=limit, loop=loop)
        transport, _ = await loop.connect_read_pipe(functools.partial(asyncio.StreamReaderProtocol, reader, loop=loop),
                                                    os.fdopen(fd, "rb", buffering=0))
        streams.append(reader)
        transports.append(transport)
    helper = Helper(popen, streams[0], streams[1], transports, charge)

    def reap() -> None:
        try:
            _, status, usage = os.wait4(popen.pid, 0)
            cpu = usage.ru_utime + usage.ru_stime
        except ChildProcessError:  # reaped by someone else: its status and CPU are lost
            status, cpu = 255 << 8, 0.0
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody to tell
            loop.call_soon_threadsafe(helper._reaped, status, cpu)

    threading.Thread(target=reap, name=f"memagent-reap-{popen.pid}", daemon=True).start()
    return helper
