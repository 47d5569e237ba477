"""The daemon's helper programs (py-spy, Austin): where to find them, and that they die
with the agent."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Callable

from .helper import Helper


def find_program(name: str, explicit: str | None = None) -> str | None:
    """``explicit`` if it is executable, else ``name`` on PATH, else beside this Python (a
    venv's ``bin``, where pip puts the py-spy and austin of their packages)."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which(name)
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), name)
    return beside if os.access(beside, os.X_OK) else None


_PR_SET_PDEATHSIG = 1


def _bind_prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, bound once, here: the child calls it between fork and exec, where
    nothing may be imported or looked up. None without it (a Python built without ctypes,
    a libc without ``prctl``): py-spy is then not tied to the agent's life, as before."""
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_prctl = _bind_prctl()


def die_with(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child killed when the agent dies, even by SIGKILL:
    a root py-spy must not outlive the daemon that started it (it would keep reading a
    process's memory for nobody). ``PR_SET_PDEATHSIG`` fires when the *thread* that
    forked ends: asyncio forks in the event loop's thread, which lives as long as the
    agent (the daemon's main thread; the embedded agent's own thread). The setting
    survives ``exec`` (py-spy is not setuid). A parent gone before the ``prctl`` is
    caught by its PID: the child then exits at once."""

    prctl = _prctl
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


async def kill_and_reap(proc: Helper) -> float | None:
    """Kill a helper and wait until it is reaped, even when cancelled again meanwhile (a
    burst stopped at its process's exit is cancelled once more when the agent stops): one
    that is not reaped before the loop closes makes its transport complain from a closed
    loop, on the user's terminal. A SIGKILLed process is reaped within milliseconds. Our
    ends of its pipes are closed then, what is left in them thrown away. Returns the CPU
    seconds it used (its ``rusage``: charged to the budget at reap)."""
    proc.kill()
    waiting = asyncio.ensure_future(proc.wait())
    while not waiting.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(waiting)
    proc.close()
    return proc.cpu_seconds
