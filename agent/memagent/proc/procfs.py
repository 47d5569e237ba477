"""/proc as the agent reads it: a tree (:class:`ProcFS`) and a handle that keeps one
process's files open (:class:`ProcessHandle`).

Why a handle: ``pread`` of an already-open ``/proc/PID/statm`` costs ~1.3 µs where
opening and reading ``/proc/PID/statm`` costs ~5 µs and ``/proc/PID/status`` ~12 µs
(measured on 1000 processes; see ``bench/``). A handle opens the process's ``/proc/PID``
directory once and opens every file *through that directory descriptor*: the descriptor
pins the process the kernel meant when we opened it, so a PID reused later can never be
read by mistake: reads on the old descriptors fail with ESRCH instead.

This is the boundary where the kernel's answers become the agent's: OS errors about a
process become :class:`~memagent.errors.NoSuchProcess` / :class:`~memagent.errors.AccessDenied`
(:func:`translate_errors`), and the higher-level reads (:func:`read_boundary`) also turn
any other OS error or unparsable content into :class:`~memagent.errors.CannotRead`.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

from ..errors import AccessDenied, CannotRead, NoSuchProcess, NotUserProcess
from .parse import (
    MAX_ARG_CHARS,
    MAX_CMDLINE_CHARS,
    Stat,
    Statm,
    StatusMemory,
    is_kernel_thread,
    parse_btime,
    parse_cmdline,
    parse_exit_signal,
    parse_meminfo,
    parse_memory_cgroup,
    parse_oom_score_adj,
    parse_pressure_some_avg10,
    parse_stat,
    parse_statm,
    parse_status_groups,
    parse_status_memory,
    parse_status_nspid,
    parse_status_uid,
    parse_status_uids,
)
from .sharing import SharingFacts, sharing_facts
from .threads import CLOCK_TICKS, thread_cpu

__all__ = ["CLOCK_TICKS", "MAX_ARG_CHARS", "MAX_CMDLINE_CHARS", "PAGE_SIZE", "MemoryAccess", "ProcFS", "ProcessFacts",
           "ProcessHandle", "read_boundary", "translate_errors"]

PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE")
_READ_SIZE: Final = 16384

log = logging.getLogger(__name__)

_GONE = {errno.ENOENT, errno.ESRCH}
_DENIED = {errno.EACCES, errno.EPERM}


@contextmanager
def translate_errors(pid: int) -> Iterator[None]:
    """Turn OS errors about ``pid`` into NoSuchProcess / AccessDenied; others (EIO,
    EMFILE) and parser errors pass through unchanged."""
    try:
        yield
    except OSError as exc:
        if exc.errno in _GONE:
            raise NoSuchProcess(pid) from None
        if exc.errno in _DENIED:
            raise AccessDenied(pid) from None
        raise


@contextmanager
def read_boundary(pid: int) -> Iterator[None]:
    """:func:`translate_errors`, and every other failure to read or parse becomes
    :class:`CannotRead`: callers above this package catch the agent's errors only."""
    try:
        with translate_errors(pid):
            yield
    except (ValueError, IndexError, OverflowError) as exc:
        raise CannotRead(pid, f"unreadable /proc contents ({exc})") from None
    except OSError as exc:
        raise CannotRead(pid, exc.strerror or type(exc).__name__) from None


@dataclass(frozen=True, slots=True)
class MemoryAccess:
    """Who could read this process's memory (with ptrace or ``process_vm_readv``, as
    py-spy does) without privileges: its UIDs, and the owner of its /proc files, which the
    kernel makes root while the process is not dumpable (setuid, ``PR_SET_DUMPABLE 0``)."""

    uids: tuple[int, int, int, int]
    proc_owner: int

    @property
    def reader(self) -> int | None:
        """The one unprivileged UID that may read it, or None: root only."""
        real, effective, saved, _ = self.uids
        return real if real == effective == saved == self.proc_owner else None


@dataclass(frozen=True, slots=True)
class ProcessFacts:
    """What attaching a process needs, read at once through its handle."""

    uid: int
    stat: Stat
    cmdline: list[str]
    statm: Statm
    memory: StatusMemory
    access: MemoryAccess
    #: The PID inside its own PID namespace when nested (a container), else None.
    ns_pid: int | None = None


class ProcFS:
    """A /proc tree; ``root`` is a fixture directory in tests."""

    def __init__(self, root: str = "/proc") -> None:
        self.root = root
        self._boot_time: int | None = None
        #: The last good /proc/meminfo and when it was read (see :meth:`meminfo`).
        self._meminfo: dict[str, int] = {}
        self._meminfo_at: float | None = None
        #: Why the last read of /proc/meminfo failed, for humans; None when it worked.
        self.meminfo_fault: str | None = None

    def path(self, *parts: object) -> str:
        return os.path.join(self.root, *(str(p) for p in parts))

    @property
    def is_kernel(self) -> bool:
        """The kernel's own /proc (not a fixture tree): kernel events are about it."""
        return os.path.realpath(self.root) == "/proc"

    def read(self, *parts: object) -> bytes:
        with open(self.path(*parts), "rb") as f:
            return f.read()

    @property
    def boot_time(self) -> int:
        if self._boot_time is None:
            self._boot_time = parse_btime(self.read("stat"))
        return self._boot_time

    def unix_start_time(self, starttime_ticks: int) -> float:
        return self.boot_time + starttime_ticks / CLOCK_TICKS

    def start_time(self, pid: int, starttime_ticks: int) -> float:
        """:meth:`unix_start_time` of ``pid``, with a /proc/stat that cannot be read or
        has no ``btime`` as :class:`CannotRead` (an attach then fails as an agent error)."""
        with read_boundary(pid):
            return self.unix_start_time(starttime_ticks)

    def pids(self) -> list[int]:
        return [int(name) for name in os.listdir(self.root) if name.isdigit()]

    def meminfo(self) -> dict[str, int]:
        """``/proc/meminfo`` in bytes per key, or the last good reading when this one cannot
        be read, does not parse or has no ``MemTotal``: one bad read (a kernel bug, a
        broken container's /proc) must not fail every tick, and so every alert, nor the
        status. :attr:`meminfo_fault` says why until a read works again (``{}`` before
        the first good one)."""
        try:
            info = parse_meminfo(self.read("meminfo"))
            if info.get("MemTotal", 0) <= 0:
                raise ValueError("no MemTotal")
        except (OSError, ValueError) as exc:
            reason = (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc))[:200]
            last = "none read yet" if self._meminfo_at is None else \
                f"using the last good reading, of {time.strftime('%H:%M:%S', time.localtime(self._meminfo_at))}"
            if self.meminfo_fault is None:
                log.warning("%s unreadable (%s): %s", self.path("meminfo"), reason, last)
            self.meminfo_fault = f"{self.path('meminfo')} unreadable ({reason}): {last}"
            return self._meminfo
        if self.meminfo_fault is not None:
            log.info("%s readable again", self.path("meminfo"))
            self.meminfo_fault = None
        self._meminfo, self._meminfo_at = info, time.time()
        return info

    @property
    def faults(self) -> list[str]:
        """What could not be read at the last try and is being worked around, for the
        status (:class:`memproto.records.DaemonStatus` ``faults``)."""
        return [] if self.meminfo_fault is None else [self.meminfo_fault]

    def memory_pressure(self) -> float | None:
        """Memory PSI ``some avg10`` in percent; None where /proc/pressure is missing."""
        try:
            return parse_pressure_some_avg10(self.read("pressure", "memory"))
        except (OSError, ValueError):
            return None

    def stat(self, pid: int) -> Stat:
        """Parsed ``/proc/PID/stat``; NoSuchProcess, AccessDenied, CannotRead."""
        with read_boundary(pid):
            return parse_stat(self.read(pid, "stat"))

    def groups(self, pid: int) -> set[int]:
        """The real GID and supplementary groups of ``pid``."""
        with read_boundary(pid):
            return parse_status_groups(self.read(pid, "status"))

    def children(self, pid: int) -> list[int]:
        """The children of ``pid``'s main thread (``/proc/PID/task/PID/children``: a wrapper
        such as ``sh -c`` or ``runuser`` forks from its only thread); [] when gone, not
        readable, or the kernel lacks the file (CONFIG_PROC_CHILDREN)."""
        try:
            with open(self.path(pid, f"task/{pid}/children"), "rb") as f:
                return [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            return []

    def exe_name(self, pid: int) -> str | None:
        """Basename of ``/proc/PID/exe``; None when not ours to read or a kernel thread."""
        try:
            return os.path.basename(os.readlink(self.path(pid, "exe")))
        except OSError:
            return None

    def cmdline_text(self, pid: int, limit: int) -> str | None:
        """``pid``'s argv joined by spaces, as ``ps`` shows it, from the first ``limit``
        bytes of ``/proc/PID/cmdline``; None when gone or not readable."""
        try:
            with open(self.path(pid, "cmdline"), "rb") as f:
                data = f.read(limit)
        except OSError:
            return None
        return data.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")

    def ns_pid(self, pid: int) -> int | None:
        """``pid``'s PID inside its own PID namespace when nested, else (or unreadable) None."""
        try:
            return parse_status_nspid(self.read(pid, "status"))
        except (OSError, ValueError):
            return None

    def memory_cgroup(self, pid: int) -> str | None:
        """The memory cgroup of ``pid`` (see :func:`~memagent.proc.parse.parse_memory_cgroup`)."""
        try:
            return parse_memory_cgroup(self.read(pid, "cgroup"))
        except (OSError, ValueError):
            return None

    def open(self, pid: int) -> ProcessHandle:
        return ProcessHandle(self, pid)


class ProcessHandle:
    """Open descriptors on one process's /proc files, read with ``pread``.

    The identity ``(pid, starttime)`` is fixed when the handle opens; every later read
    goes through descriptors bound to that very process. The sampler's hot loop reads
    :attr:`statm_fd` and :attr:`status_fd` directly (a method call per process would
    cost more than the read).
    """

    __slots__ = ("_dir", "closed", "pid", "starttime", "statm_fd", "status_fd")

    def __init__(self, procfs: ProcFS, pid: int) -> None:
        self.pid = pid
        self.closed = False
        self._dir = self.statm_fd = self.status_fd = -1
        with read_boundary(pid):
            self._dir = os.open(procfs.path(pid), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                stat = parse_stat(self._read_at("stat"))
                if is_kernel_thread(stat):
                    raise NotUserProcess(pid)
                self.starttime = stat.starttime
                self.statm_fd = os.open("statm", os.O_RDONLY | os.O_CLOEXEC, dir_fd=self._dir)
                self.status_fd = os.open("status", os.O_RDONLY | os.O_CLOEXEC, dir_fd=self._dir)
            except BaseException:
                self.close()
                raise

    @property
    def dir_fd(self) -> int:
        """The ``/proc/PID`` directory descriptor that pins the process (-1 once closed)."""
        return self._dir

    def _read_at(self, name: str) -> bytes:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=self._dir)
        try:
            return os.pread(fd, _READ_SIZE, 0)
        finally:
            os.close(fd)

    def statm_bytes(self) -> bytes:
        """Raw statm; the sampler compares it with the last tick's to skip work."""
        with translate_errors(self.pid):
            return os.pread(self.statm_fd, 256, 0)

    def status_bytes(self) -> bytes:
        with translate_errors(self.pid):
            return os.pread(self.status_fd, _READ_SIZE, 0)

    def write(self, name: str, data: bytes, *, truncate: bool = False) -> None:
        """``data`` written to one of its files; ``truncate`` as a shell's ``>`` opens it
        (the kernel ignores it on /proc; a fixture tree's regular file needs it)."""
        with translate_errors(self.pid):
            fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC | (os.O_TRUNC if truncate else 0), dir_fd=self._dir)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)

    # ------------------------------------------------------------------ parsed reads

    def facts(self) -> ProcessFacts:
        """Owner, stat, command line and memory, for attaching."""
        with read_boundary(self.pid):
            status = self.status_bytes()
            access = MemoryAccess(parse_status_uids(status), self._file_owner())
            return ProcessFacts(parse_status_uid(status), parse_stat(self._read_at("stat")),
                                parse_cmdline(self._read_at("cmdline")), parse_statm(self.statm_bytes()),
                                parse_status_memory(status), access, parse_status_nspid(status))

    def memory_access(self) -> MemoryAccess:
        """Who may read this process's memory now (see :class:`MemoryAccess`)."""
        with read_boundary(self.pid):
            uids = parse_status_uids(self.status_bytes())
            return MemoryAccess(uids, self._file_owner())

    def _file_owner(self) -> int:
        """The owner the kernel gives this process's files now: its effective UID, or root
        while it is not dumpable (the directory itself keeps the effective UID). A fresh
        lookup (``stat`` by name): that is when the kernel recomputes it."""
        return os.stat("status", dir_fd=self._dir).st_uid

    def memory(self) -> tuple[Statm, StatusMemory]:
        """statm and the status memory lines, read now."""
        with read_boundary(self.pid):
            return parse_statm(self.statm_bytes()), parse_status_memory(self.status_bytes())

    def clear_refs(self) -> None:
        """Reset the kernel's high-water mark (VmHWM) to the current RSS; AccessDenied
        where the kernel refuses it."""
        with read_boundary(self.pid):
            self.write("clear_refs", b"5")

    def oom_score_adj(self) -> int:
        """The process's ``oom_score_adj`` now (-1000 to 1000). NoSuchProcess, AccessDenied
        or CannotRead."""
        with read_boundary(self.pid):
            return parse_oom_score_adj(self._read_at("oom_score_adj"))

    def set_oom_score_adj(self, value: int) -> None:
        """Write ``value`` to this very process's ``oom_score_adj`` (through the directory
        descriptor that pins it: a PID reused since can never be written). AccessDenied
        where the kernel refuses (a value below the process's floor without
        ``CAP_SYS_RESOURCE``), NoSuchProcess once it is gone, CannotRead for the rest."""
        with read_boundary(self.pid):
            self.write("oom_score_adj", str(value).encode(), truncate=True)

    def exit_signal(self) -> int | None:
        """The signal that ended this process while it is a zombie; None when unknown."""
        try:
            with read_boundary(self.pid):
                return parse_exit_signal(self._read_at("stat"))
        except (CannotRead, NoSuchProcess, AccessDenied):
            return None

    def sharing(self, keys: bool = True) -> SharingFacts:
        """Shared excess, parent and, with ``keys``, the sharing keys from ``maps``
        (:mod:`.sharing`). smaps_rollup walks the whole memory map under the target's mmap
        lock: call it off the tick. NoSuchProcess, AccessDenied or CannotRead when it
        cannot be read."""
        with read_boundary(self.pid):
            return sharing_facts(self._read_at("smaps_rollup"), self._read_all("maps") if keys else None,
                                 self._read_at("stat"))

    def maps(self) -> bytes:
        """``/proc/PID/maps``, whole. NoSuchProcess, AccessDenied or CannotRead."""
        with read_boundary(self.pid):
            return self._read_all("maps")

    def _read_all(self, name: str) -> bytes:
        """A file of any length (``maps`` of a large process is hundreds of KiB)."""
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=self._dir)
        try:
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def resident_bytes(self) -> int:
        """RSS now, from statm: read around a stack dump, it tells whether memory rose meanwhile."""
        with read_boundary(self.pid):
            return parse_statm(self.statm_bytes()).resident * PAGE_SIZE

    def thread_cpu(self, tids: Iterable[int] | None = None) -> dict[int, int]:
        """Each thread's CPU time so far (TID -> ns; gone threads left out), or of the
        threads ``tids`` only: two readings tell which threads ran in between
        (:func:`.threads.thread_cpu`)."""
        with read_boundary(self.pid):
            return thread_cpu(self._dir, tids)

    def alive(self) -> bool:
        """Whether the process is still there (a read through its descriptors works)."""
        try:
            with read_boundary(self.pid):
                os.pread(self.statm_fd, 256, 0)
            return True
        except (CannotRead, NoSuchProcess, AccessDenied):
            return False

    def close(self) -> None:
        for fd in (self.statm_fd, self.status_fd, self._dir):
            if fd >= 0:
                os.close(fd)
        self.statm_fd = self.status_fd = self._dir = -1
        self.closed = True
