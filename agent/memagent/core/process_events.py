"""What the kernel's process events mean for the watched set (the events themselves:
:mod:`memagent.proc.netlink`; what /proc shows of an ending process:
:mod:`memagent.proc.lifecycle`).

* ``fork`` of a process whose children are followed: the child is attached at once, at
  its first instant (the /proc scan, once a second, never sees a child that lives less).
  Until its first ``exec`` it runs its parent's image (under ``vfork`` its very memory),
  so at that ``exec`` its figures start afresh (:meth:`Watched.new_image`), and its
  owner and who may read its memory are read again (a set-user-ID program's memory is
  root's to read; a process that is no longer the follower's to watch is dropped).
* ``exec`` of a process not watched: ``--auto`` patterns are matched at once.
* ``exec`` of a watched process: its name and command line are read again and announced
  (:meth:`Registry.refresh_program`); its label is kept. Without the events (polling, or
  an overrun) the sampler notices a changed name at its next status read.
* A taskstats exit record of a watched process: its final VmHWM
  (:meth:`Watched.take_exit_hwm`), which makes the peak of an exited process exact.

The sampler still tells an exit and marks it, with the alerts and stack collection of
that tick; just before, it calls :meth:`ProcessEvents.drain` so that the exit record,
queued by the kernel before the process could read as gone, is taken first.

Whose record: the records of one PID come in the order of its holders' lives, and the
entries of one PID in attach order, so a record goes to the oldest entry of its PID
(``tgid`` when it has one, else ``pid``) still waiting for one: a live entry without a
record, or an exited one within :data:`LATE_RECORD_S` of its exit (a record delayed by a
full batch). The four hard cases:

1. **The main thread exits first** (``pthread_exit``) while others run: its statm reads
   as a zombie's, but the process lives on; the sampler reads it through a live thread
   (:func:`~memagent.proc.lifecycle.follow_thread`) and marks it exited only when no
   thread has the memory map. The main thread's record (no ``tgid``) is not the final
   peak: a record without ``tgid`` of a live entry whose process still lists other
   threads, or whose thread group's record comes later in the same batch, is passed
   over. The final peak is that of the group's record (with ``tgid``), sent by the last
   thread before the process can read as gone.
2. **PID reuse** (a watched process exits and its PID is another's before the next
   tick): the sampler reads through descriptors pinned to the old process, which fail
   with ESRCH; a fork or exec event for a PID whose live entry is reaped
   (:func:`~memagent.proc.lifecycle.reaped`) is the new process's (not its parent's
   children, not its program), and attaching the PID attaches the new process beside
   the old entry, which the next tick marks exited. Records go oldest entry first, so
   the old process's record lands on its own entry, the new one's on the new.
3. **A child reaped before its fork is handled**: the PID is free or another's. The
   process that holds it is attached only if it is the followed parent's child (its
   ``ppid``), else the child is remembered, and its exit record, if it comes within
   :data:`LATE_RECORD_S` and names that parent (``ppid``), makes an exited entry with its
   exact peak (:meth:`Registry.add_gone`: its name is the record's ``comm``, its command
   line unknown). A child attached at its fork already exited (a zombie) takes the last
   record of its PID in that batch that names its parent (nothing can reuse a zombie's
   PID); one attached running takes none from that batch: those are earlier holders'.
4. **Overruns** (a socket's buffer overflowed: ENOBUFS, counted by the source, shown by
   ``memagent status``): the kernel does not say what was lost. Lost forks and execs: the
   /proc scan runs at once (followed children, ``--auto``). Lost records: every entry
   whose process no longer runs (its record may be among the lost) takes no record any
   more, since the next record of its PID may be another process's: its peak is the
   sampled one, flagged not exact. Entries still running lost nothing.

Not told apart: a main thread exiting first, the rest of its process ending, being reaped
and its PID reused, all between two reads of the sockets (its main thread's record may
then count as final); and a record of an unwatched holder of a PID read in the next batch
after the fork of a watched new holder was handled, when both fall between the two
socket reads of :meth:`ProcessEventSource.read_pending` (microseconds).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..errors import MemagentError, NoSuchProcess
from ..proc.lifecycle import other_threads, reaped, running
from ..proc.netlink import ProcessEventSource, open_source
from ..proc.netlink_msg import EXEC, FORK, ExitStats, ProcEvent
from ..proc.procfs import CLOCK_TICKS
from .autoattach import Scanner
from .registry import Registry
from .watched import Watched

log = logging.getLogger(__name__)

NETLINK = "netlink"
POLLING = "polling"
#: How long after the sampler found a process exited its exit record is still taken, and
#: how long a child reaped before its fork was handled waits for its record.
LATE_RECORD_S = 5.0
#: Children reaped before their fork was handled, remembered at most (a fork storm).
MAX_UNBORN = 4096


def _key(x: ExitStats) -> int:
    """The process a record is about: its thread group, or the task itself."""
    return x.tgid if x.tgid is not None else x.pid


class ProcessEvents:
    def __init__(self, registry: Registry, scanner: Scanner,
                 on_sharing_change: Callable[[int], None] | None = None) -> None:
        self.registry = registry
        self.scanner = scanner
        self.source: ProcessEventSource | None = None
        #: Why the agent polls instead (None while it listens).
        self.note: str | None = "not started"
        self._version = -1
        #: The newest live entry of each PID.
        self._alive: dict[int, Watched] = {}
        #: Every entry of each PID, oldest first: who a record is for.
        self._by_pid: dict[int, list[Watched]] = {}
        #: Entries that take no record any more (theirs may have been lost).
        self._closed: set[tuple[int, int]] = set()
        #: Children reaped before their fork was handled: PID -> (parent, when).
        self._unborn: dict[int, tuple[Watched, float]] = {}
        #: Told the PID of a watched process that forked or ran a new program: what it
        #: shares with others has changed (see memagent.core.sharing).
        self.on_sharing_change = on_sharing_change

    @property
    def mode(self) -> str:
        return NETLINK if self.source is not None else POLLING

    def open(self, enabled: bool = True) -> tuple[int, ...]:
        """Start listening; returns the descriptors to watch for reading (none when polling)."""
        if not enabled:
            self.note = "disabled by configuration (netlink = false, --no-netlink)"
            return ()
        if not self.registry.procfs.is_kernel:
            self.note = "not the kernel's /proc (a fixture tree)"
            return ()
        self.source, self.note = open_source()
        if self.source is None:
            log.info("process events: polling /proc (%s)", self.note)
            return ()
        log.info("process events: netlink (proc connector and taskstats)")
        return self.source.fds

    def close(self) -> None:
        if self.source is not None:
            self.source.close()
            self.source = None
            self.note = "closed"

    @property
    def overruns(self) -> int:
        return self.source.overruns if self.source is not None else 0

    def drain(self) -> None:
        """Take whatever the kernel queued (called when a socket is readable, and by the
        sampler before it marks exits); after an overrun, recover (case 4)."""
        source = self.source
        if source is None:
            return
        records_lost, events_lost = source.record_overruns, source.event_overruns
        events, exits = source.read_pending()
        now = time.time()
        if source.record_overruns != records_lost:
            self._records_lost(now)
        if events or exits:
            self.apply(events, exits, now)
        if source.event_overruns != events_lost:
            log.debug("process events lost: scanning /proc for followed children and --auto matches")
            self.scanner.scan()

    def _records_lost(self, now: float) -> None:
        """Exit records were lost: an entry whose process no longer runs may have lost its
        own, and the next record of its PID may be another process's: it takes none any
        more. A running process's record is sent when it exits: not lost."""
        self._index()
        for w in self.registry.entries.values():
            if self._waiting(w, now) and not (w.alive and running(w.handle)):
                self._closed.add(w.key)
        self._unborn.clear()

    def apply(self, events: list[ProcEvent], exits: list[ExitStats], now: float | None = None) -> None:
        """One batch: events first, then exit records (a record's fork is among the
        events; whose record is whose: the module doc)."""
        now = time.time() if now is None else now
        while self._unborn:  # oldest first: forget those whose record is overdue
            pid, (_parent, since) = next(iter(self._unborn.items()))
            if now - since <= LATE_RECORD_S:
                break
            del self._unborn[pid]
        fresh: dict[int, tuple[Watched, int]] = {}
        for e in events:
            if e.kind == FORK:
                self._on_fork(e.pid, e.parent, now, fresh)
            elif e.kind == EXEC:
                self._on_exec(e.pid)
        if not exits:
            return
        self._index()
        #: Thread group -> where its (final) record is in the batch.
        ends = {x.tgid: i for i, x in enumerate(exits) if x.tgid is not None}
        # A child attached at its fork that had exited already takes its own record: the
        # last of its PID that names its parent.
        own: dict[int, int] = {}
        for i, x in enumerate(exits):
            child = fresh.get(_key(x))
            if child is not None and child[0].rss == 0 and x.ppid == child[1]:
                own[_key(x)] = i
        for i, x in enumerate(exits):
            if not self._on_exit_record(x, i, ends, fresh, own, now):
                self._on_unborn_record(x, i, ends, now)

    # ------------------------------------------------------------------ the events

    def _index(self) -> None:
        if self._version != self.registry.version:
            self._version = self.registry.version
            self._alive = {w.pid: w for w in self.registry.alive}
            by_pid: dict[int, list[Watched]] = {}
            for w in self.registry.entries.values():
                by_pid.setdefault(w.pid, []).append(w)
            self._by_pid = by_pid
            self._closed.intersection_update(self.registry.entries)

    def _holder(self, pid: int) -> Watched | None:
        """The live entry of the process that holds ``pid`` now; None when not watched,
        or when the entry's process was reaped (the PID is another's: case 2)."""
        self._index()
        w = self._alive.get(pid)
        if w is None or reaped(w.handle):
            return None
        return w

    def _on_fork(self, pid: int, parent_pid: int, now: float, fresh: dict[int, tuple[Watched, int]]) -> None:
        parent = self._holder(parent_pid)
        if parent is None:
            return
        if self.on_sharing_change is not None:
            self.on_sharing_change(parent_pid)
        if not parent.follow_children or self._holder(pid) is not None:
            return
        try:
            if self.registry.procfs.stat(pid).ppid != parent_pid:
                raise NoSuchProcess(pid, "reaped; the PID is another process's")
            (child,) = self.scanner.adopt(pid, parent, descendants=False)
        except NoSuchProcess:  # reaped before its fork was handled (case 3)
            if len(self._unborn) < MAX_UNBORN:
                self._unborn.pop(pid, None)  # re-inserted: the dict stays in time order
                self._unborn[pid] = (parent, now)
            return
        except MemagentError as exc:  # not the follower's to see
            log.debug("child %d of %d not attached at its fork: %s", pid, parent_pid, exc)
            return
        child.pre_exec = True
        fresh[pid] = (child, parent_pid)

    def _on_exec(self, pid: int) -> None:
        w = self._holder(pid)
        if w is None:
            if self.scanner.patterns:
                self.scanner.on_exec(pid)
            return
        if self.on_sharing_change is not None:
            self.on_sharing_change(pid)
        if not w.pre_exec:
            self.registry.refresh_program(w)  # its new name and command line, announced
            return
        try:
            facts = w.handle.facts()
        except MemagentError:  # exited already: its exit record will have its figures
            w.new_image(w.name, w.cmdline, 0, 0, None, None)
            return
        may_watch = w.follow_may_watch
        if may_watch is not None and not may_watch(facts.uid):
            log.info("pid %d ran a program of uid %d: no longer watched for its follower", pid, facts.uid)
            self.registry.detach(pid)
            return
        w.uid = facts.uid
        w.memory_reader = facts.access.reader
        w.new_image(facts.stat.comm, facts.cmdline, facts.statm.resident, facts.statm.shared,
                    facts.memory.hwm_bytes, facts.memory.swap_bytes)

    # ------------------------------------------------------------------ exit records

    def _waiting(self, w: Watched, now: float) -> bool:
        if w.exit_hwm is not None or w.key in self._closed:
            return False
        return w.alive or (w.exited_at is not None and now - w.exited_at <= LATE_RECORD_S)

    def _on_exit_record(self, x: ExitStats, i: int, ends: dict[int, int], fresh: dict[int, tuple[Watched, int]],
                        own: dict[int, int], now: float) -> bool:
        """Give the record to its entry; False when it is no watched process's."""
        key = _key(x)
        for w in self._by_pid.get(key, ()):
            if not self._waiting(w, now):
                continue
            if key in fresh and fresh[key][0] is w and own.get(key) != i:
                continue  # attached at its fork in this batch: not its record (case 3)
            break
        else:
            return False
        if x.tgid is None and (ends.get(key, -1) > i or (w.alive and other_threads(w.handle))):
            return True  # its main thread's, which exited first: the group's record is the final one
        w.take_exit_hwm(x.hiwater_rss_bytes)
        return True

    def _on_unborn_record(self, x: ExitStats, i: int, ends: dict[int, int], now: float) -> None:
        """The record of a child reaped before its fork was handled (case 3)."""
        key = _key(x)
        unborn = self._unborn.get(key)
        if unborn is None or x.ppid != unborn[0].pid or now - unborn[1] > LATE_RECORD_S:
            return
        if x.tgid is None and ends.get(key, -1) > i:
            return  # its main thread's: its group's record follows
        parent, _since = self._unborn.pop(key)
        may_watch = parent.follow_may_watch or self.scanner.may_watch
        if not may_watch(x.uid):
            return
        procfs = self.registry.procfs
        start = x.btime or now
        starttime = max(0, round((start - procfs.boot_time) * CLOCK_TICKS))
        self.registry.add_gone(key, starttime, name=x.comm, uid=x.uid, label=parent.label,
                               label_trusted=parent.label_trusted, hwm=x.hiwater_rss_bytes, now=now)
