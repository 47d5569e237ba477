"""Python stacks from outside: the ``py-spy dump --nonblocking`` subprocess and what it says.

py-spy reads the target interpreter's memory with ``process_vm_readv``; with
``--nonblocking`` it never stops the target (no ptrace attach). Never ``--native`` (it
cannot be combined with ``--nonblocking``) and never ``--locals`` (locals can hold
secrets). Each dump is a subprocess with a timeout; a hanging py-spy is killed.

:func:`dump` returns a :class:`DumpResult`: the dump, or the stack state that says why
there is none (:class:`memproto.vocabulary.StackState`) and what the user can do.
*When* to dump, and what a dump means for attribution, is decided above, in
:mod:`memagent.core.stack_collector`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from memproto.records import StackDump, StackFrame, ThreadStack
from memproto.vocabulary import StackState

from .children import die_with, find_program, kill_and_reap
from .frames import program_frames
from .helper import Charge, no_charge, spawn

log = logging.getLogger(__name__)

#: What the user can do about each state.
ADVICE = {
    StackState.NOT_PYTHON: "not a Python process (or its interpreter is not recognised)",
    StackState.DENIED: "permission denied: run the daemon as root or with CAP_SYS_PTRACE",
    StackState.MISSING: "py-spy not found: install it (pip install py-spy) or pass --py-spy PATH",
    StackState.UNSUPPORTED: "this Python version is not supported by the installed py-spy",
    StackState.EXITED: "the process exited",
    StackState.TIMEOUT: "py-spy did not answer in time and was killed",
}


def find_py_spy(explicit: str | None = None) -> str | None:
    return find_program("py-spy", explicit)


def maps_show_python(maps: bytes) -> bool:
    """Whether a ``/proc/PID/maps`` text maps a Python interpreter (``python3.11``,
    ``libpython3.11.so``, a venv's ``python``): what py-spy looks for first. A
    ``False`` spares a py-spy run (a process start, ~ms of the daemon's CPU) on the
    ``sleep``s and shells of a watched tree; an interpreter linked statically into
    another program (uwsgi) is missed here, and found by an explicit ``stack`` request."""
    for line in maps.splitlines():
        slash = line.rfind(b"/")
        if slash >= 0 and line[slash + 1:].startswith((b"python", b"libpython")):
            return True
    return False


def classify_failure(stderr: str, pid_alive: bool) -> tuple[str, str]:
    """A failed dump's state and a one-line message, from py-spy's stderr."""
    text = stderr.strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "py-spy failed")
    lower = text.lower()
    # Permission first: py-spy's message for a process it may not read also says "check
    # that the process is running" (root without CAP_SYS_PTRACE, in a container).
    if pid_alive and ("permission denied" in lower or "operation not permitted" in lower):
        return StackState.DENIED, ADVICE[StackState.DENIED]
    if not pid_alive or "no such process" in lower or "check that the process is running" in lower:
        return StackState.EXITED, ADVICE[StackState.EXITED]
    if "failed to find python version" in lower or "doesn't look like a python" in lower:
        return StackState.NOT_PYTHON, ADVICE[StackState.NOT_PYTHON]
    if "unsupported" in lower and "version" in lower:
        return StackState.UNSUPPORTED, f"{ADVICE[StackState.UNSUPPORTED]} ({first.removeprefix('Error: ')})"
    return StackState.ERROR, first.removeprefix("Error: ")[:300]


def parse_dump(data: bytes, now: float, trigger: str, rss: int, vram: int | None) -> StackDump:
    """py-spy's JSON (a list of threads) as a :class:`StackDump` with no thread attributed
    yet, each thread's frames the program's (:func:`memagent.proc.frames.program_frames`);
    raises ValueError."""
    raw = json.loads(data)
    if not isinstance(raw, list):
        raise ValueError("py-spy JSON is not a list of threads")
    threads = []
    for t in raw:
        frames = program_frames([
            StackFrame(str(f.get("name", "?")), str(f.get("filename", "?")), int(f.get("line") or 0))
            for f in t.get("frames", [])
        ])
        name, tid = t.get("thread_name"), t.get("os_thread_id")
        threads.append(ThreadStack(int(t.get("thread_id", 0)), None if name is None else str(name),
                                   bool(t.get("active")), bool(t.get("owns_gil")), frames,
                                   None if tid is None else int(tid)))
    return StackDump(now, trigger, rss, vram, threads)


@dataclass(frozen=True, slots=True)
class DumpResult:
    """A dump, or the state (and message) that says why there is none."""

    dump: StackDump | None
    state: str
    message: str | None = None


async def dump(py_spy: str, pid: int, timeout: float, now: Callable[[], float], trigger: str, rss: int,
               vram: int | None, pid_alive: Callable[[], bool], charge: Charge = no_charge) -> DumpResult:
    """Run ``py-spy dump --nonblocking --json`` on ``pid``. ``rss``/``vram`` are the
    process's memory when the dump was asked for; ``charge`` is told what the dump cost
    (py-spy's CPU from its rusage, the daemon's in starting it and reading its JSON).

    py-spy takes a PID, not a pinned process: ``pid_alive`` must say whether *the watched
    process* (not whatever holds the PID now) still exists, e.g. by a read through its
    pinned /proc directory. It is asked before the dump and after it: a PID is reused only
    once its process is gone and reaped, so a process there at both ends held the PID all
    along and the dump is its own; otherwise the dump is discarded. After a failure it
    decides between exited and denied."""
    if not pid_alive():
        return DumpResult(None, StackState.EXITED, ADVICE[StackState.EXITED])
    env = {**os.environ, "RUST_BACKTRACE": "0"}
    try:
        proc = await spawn([py_spy, "dump", "--pid", str(pid), "--nonblocking", "--json"], charge, env=env,
                           preexec_fn=die_with(os.getpid()))
    except OSError as exc:
        return DumpResult(None, StackState.ERROR, f"cannot run py-spy: {exc.strerror}")
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        await kill_and_reap(proc)
        log.warning("py-spy on %d hung for %g s: killed", pid, timeout)
        return DumpResult(None, StackState.TIMEOUT, ADVICE[StackState.TIMEOUT])
    except asyncio.CancelledError:
        await kill_and_reap(proc)  # the agent stops mid-dump: reaped before its loop closes
        raise
    proc.close()
    if proc.returncode != 0:
        state, message = classify_failure(err.decode("utf-8", "replace"), pid_alive())
        return DumpResult(None, state, message)
    started = time.thread_time()
    try:
        taken = parse_dump(out, now(), trigger, rss, vram)
    except (ValueError, TypeError, KeyError) as exc:
        return DumpResult(None, StackState.ERROR, f"unreadable py-spy output: {exc}")
    finally:
        charge(time.thread_time() - started, 0.0)
    if not pid_alive():  # gone during the dump: the PID may have been another process's
        return DumpResult(None, StackState.EXITED, ADVICE[StackState.EXITED] + " (during the dump: discarded)")
    return DumpResult(taken, StackState.OK)
