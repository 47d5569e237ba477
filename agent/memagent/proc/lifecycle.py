"""What /proc shows of a process as it ends, read through the descriptors of its
:class:`~memagent.proc.procfs.ProcessHandle` (so that a PID reused since is never read).

What the kernel does (checked on Linux 6.x, see ``tests/e2e/test_netlink_corners.py``):

* **The main thread exits first** (``pthread_exit`` in ``main``) while other threads run
  on: the main thread is a zombie (``State: Z``) until the last thread exits, and its
  ``/proc/PID/statm`` reads ``0 0 0 0 0 0 0`` and its ``status`` has no ``Vm`` lines, for
  the whole process: those files follow the main thread's own memory map, which it
  dropped. The map is the process's, shared by every thread: ``/proc/PID/task/TID/statm``
  and ``status`` of a thread that runs show it (``VmHWM`` is per map: the process's
  peak). :func:`follow_thread` moves the handle's memory descriptors there.
* **A zombie** (every thread exited, not yet reaped): ``statm`` all zeros, ``task/``
  lists the main thread only.
* **Reaped**: every read and lookup through the old descriptors fails with ESRCH, even
  when the PID is another process's already (:func:`reaped`).
"""

from __future__ import annotations

import os

from .procfs import ProcessHandle

_ZOMBIE_STATM = b"0 "


def _listed_threads(handle: ProcessHandle) -> list[int]:
    """The thread IDs in ``task/`` (the main thread too, even a zombie); [] once reaped."""
    try:
        fd = os.open("task", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=handle.dir_fd)
    except OSError:
        return []
    try:
        return [int(name) for name in os.listdir(fd) if name.isdigit()]
    except OSError:
        return []
    finally:
        os.close(fd)


def _has_memory(handle: ProcessHandle, tid: int) -> bool:
    try:
        fd = os.open(f"task/{tid}/statm", os.O_RDONLY | os.O_CLOEXEC, dir_fd=handle.dir_fd)
    except OSError:
        return False
    try:
        return not os.pread(fd, 256, 0).startswith(_ZOMBIE_STATM)
    except OSError:
        return False
    finally:
        os.close(fd)


def live_thread(handle: ProcessHandle) -> int | None:
    """A thread that still has the process's memory map, or None: the process is gone, a
    zombie, or its last threads are past dropping their map."""
    for tid in _listed_threads(handle):
        if _has_memory(handle, tid):
            return tid
    return None


def follow_thread(handle: ProcessHandle) -> bool:
    """The memory descriptors (``statm_fd``, ``status_fd``) read as a zombie's or fail:
    move them to a thread that still has the memory map and return True (the main thread,
    or the thread read until now, exited first); False when none has (the process
    exited). Never raises. The caller copies the new descriptors where it keeps them."""
    for _ in range(8):  # a thread found may exit before it is opened: look again
        tid = live_thread(handle)
        if tid is None:
            return False
        try:
            statm = os.open(f"task/{tid}/statm", os.O_RDONLY | os.O_CLOEXEC, dir_fd=handle.dir_fd)
        except OSError:
            continue
        try:
            status = os.open(f"task/{tid}/status", os.O_RDONLY | os.O_CLOEXEC, dir_fd=handle.dir_fd)
        except OSError:
            os.close(statm)
            continue
        for fd in (handle.statm_fd, handle.status_fd):
            if fd >= 0:
                os.close(fd)
        handle.statm_fd, handle.status_fd = statm, status
        return True
    return False


def running(handle: ProcessHandle) -> bool:
    """Whether the process still has its memory map in some thread: it has not reached
    its exit (whose taskstats record is sent just before the map is dropped)."""
    try:
        if not os.pread(handle.statm_fd, 256, 0).startswith(_ZOMBIE_STATM):
            return True
    except OSError:
        pass
    return live_thread(handle) is not None


def other_threads(handle: ProcessHandle) -> bool:
    """Whether threads other than the main one are still listed: a thread stays listed
    until it is reaped, after its own exit record was sent."""
    return any(tid != handle.pid for tid in _listed_threads(handle))


def reaped(handle: ProcessHandle) -> bool:
    """Whether the process is gone for good: its PID is free or another process's. A
    zombie, or a process whose main thread exited, is not (its directory still answers)."""
    try:
        os.close(os.open("stat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=handle.dir_fd))
    except OSError:
        return True
    return False


class GoneHandle(ProcessHandle):
    """The handle of a process that was reaped before the agent could open it (a followed
    parent's child, known from its exit record only): closed from the start, every read
    fails as it does for any exited process."""

    __slots__ = ()

    def __init__(self, pid: int, starttime: int) -> None:  # opens nothing, on purpose
        self.pid = pid
        self.starttime = starttime
        self.closed = True
        self._dir = self.statm_fd = self.status_fd = -1
