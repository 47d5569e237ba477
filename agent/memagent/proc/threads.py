"""Per-thread CPU time of a process, from its ``task/`` directory: which of its threads
ran between two readings (growth is credited to the stacks of the threads that ran,
docs/stacks.md)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from typing import Final

from .parse import parse_thread_cpu

#: Clock ticks per second of ``stat``'s utime/stime (``sysconf(SC_CLK_TCK)``).
CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")
_READ_SIZE: Final = 1024


def thread_cpu(process_dir: int, tids: Iterable[int] | None = None) -> dict[int, int]:
    """TID -> CPU time in ns of each thread under the open ``/proc/PID`` directory
    ``process_dir`` (or of the threads ``tids`` only, with no directory listing: read at each
    sampled round of a burst, for the few threads with Python stacks); threads gone
    meanwhile are left out. ``schedstat`` (ns), else ``stat``'s clock ticks. OSError (the
    process is gone) is the caller's to translate."""
    task = os.open("task", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=process_dir)
    try:
        cpu = {}
        for name in os.listdir(task) if tids is None else map(str, tids):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError, IndexError):
                cpu[int(name)] = _thread_ns(task, name)
        return cpu
    finally:
        os.close(task)


def _thread_ns(task: int, tid: str) -> int:
    try:
        fd = os.open(f"{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=task)
        ticks = False
    except FileNotFoundError:  # a kernel without CONFIG_SCHED_INFO
        fd = os.open(f"{tid}/stat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=task)
        ticks = True
    try:
        data = os.pread(fd, _READ_SIZE, 0)
    finally:
        os.close(fd)
    return parse_thread_cpu(data) * (1_000_000_000 // CLOCK_TICKS) if ticks else int(data.split()[0])
