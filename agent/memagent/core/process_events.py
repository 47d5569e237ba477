"""What the kernel's process events mean for the watched set (the events themselves:
:mod:`memagent.proc.netlink`).

* ``fork`` of a process whose children are followed: the child is attached at once, at
  its first instant (the /proc scan, once a second, never sees a child that lives less).
  Until its first ``exec`` it runs its parent's image (under ``vfork`` its very memory),
  so at that ``exec`` its figures start afresh (:meth:`Watched.new_image`), and its
  owner and who may read its memory are read again (a set-user-ID program's memory is
  root's to read; a process that is no longer the follower's to watch is dropped).
* ``exec`` of a process not watched: ``--auto`` patterns are matched at once.
* A taskstats exit record of a watched process: its final VmHWM
  (:meth:`Watched.take_exit_hwm`), which makes the peak of an exited process exact.

The sampler still tells an exit (zombie ``statm`` or ESRCH) and marks it, with the
alerts and stack collection of that tick; just before, it calls :meth:`ProcessEvents.drain`
so that the exit record, queued by the kernel before the process could read as gone, is
taken first. A record that comes later (a thread of the process was still exiting) still
raises the exited entry's peak.

PIDs and reuse: a fork event names the child while it exists (it cannot have been reaped
before its fork event was queued, and the agent opens it through its /proc directory,
which pins it); an exit record matches the live entry of its PID only if that entry has
none yet, the records of one PID arriving in order. An entry that the sampler found
exited takes only a thread group's last record (``tgid``), within :data:`LATE_RECORD_S`.
"""

from __future__ import annotations

import logging
import time

from ..errors import MemagentError
from ..proc.netlink import ProcessEventSource, open_source
from ..proc.netlink_msg import EXEC, FORK, ExitStats, ProcEvent
from .autoattach import Scanner
from .registry import Registry
from .watched import Watched

log = logging.getLogger(__name__)

NETLINK = "netlink"
POLLING = "polling"
#: How long after the sampler found a process exited its thread group's last exit record
#: is still taken.
LATE_RECORD_S = 5.0


class ProcessEvents:
    def __init__(self, registry: Registry, scanner: Scanner) -> None:
        self.registry = registry
        self.scanner = scanner
        self.source: ProcessEventSource | None = None
        #: Why the agent polls instead (None while it listens).
        self.note: str | None = "not started"
        self._version = -1
        self._alive: dict[int, Watched] = {}
        self._exited: dict[int, Watched] = {}

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
        sampler before it marks exits)."""
        if self.source is not None:
            events, exits = self.source.read_pending()
            if events or exits:
                self.apply(events, exits)

    def apply(self, events: list[ProcEvent], exits: list[ExitStats], now: float | None = None) -> None:
        """Events first, then exit records (a record's fork is among the events)."""
        for e in events:
            if e.kind == FORK:
                self._on_fork(e.pid, e.parent, now)
            elif e.kind == EXEC:
                self._on_exec(e.pid)
        for x in exits:
            self._on_exit_record(x, time.time() if now is None else now)

    # ------------------------------------------------------------------ the events

    def _index(self) -> None:
        if self._version != self.registry.version:
            self._version = self.registry.version
            self._alive = {w.pid: w for w in self.registry.alive}
            self._exited = {w.pid: w for w in self.registry.entries.values() if not w.alive and w.exit_hwm is None}

    def _on_fork(self, pid: int, parent_pid: int, now: float | None) -> None:
        self._index()
        parent = self._alive.get(parent_pid)
        if parent is None or not parent.follow_children or pid in self._alive:
            return
        try:
            (child,) = self.scanner.adopt(pid, parent, descendants=False)
        except MemagentError as exc:  # reaped already, or not the follower's to see
            log.debug("child %d of %d not attached at its fork: %s", pid, parent_pid, exc)
            return
        child.pre_exec = True

    def _on_exec(self, pid: int) -> None:
        self._index()
        w = self._alive.get(pid)
        if w is None:
            if self.scanner.patterns:
                self.scanner.on_exec(pid)
            return
        if not w.pre_exec:
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

    def _on_exit_record(self, x: ExitStats, now: float) -> None:
        self._index()
        if x.tgid is not None:  # the last thread of a thread group: the process ended
            w = self._alive.get(x.tgid)
            if w is None:
                late = self._exited.get(x.tgid)
                if late is None or late.exited_at is None or now - late.exited_at > LATE_RECORD_S:
                    return
                w = late
        else:  # a task without other threads, or a thread (whose ID no process has)
            w = self._alive.get(x.pid)
            if w is None or w.exit_hwm is not None:
                return
        w.take_exit_hwm(x.hiwater_rss_bytes)
