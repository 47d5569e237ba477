"""Auto-attach: watch every process, existing or new, whose executable name matches a
pattern, and the children of processes attached with ``--children``.

A scan lists ``/proc`` (~120 µs for 1000 processes) and looks only at PIDs it has not
seen before. A process caught between ``fork`` and ``exec`` still carries its parent's
name, so an unmatched new PID is looked at again on the next few scans.

Matched names: the kernel's ``comm`` and the basename of ``/proc/PID/exe`` (fnmatch,
case-sensitive). The agent's own process and the memagent/memtop tools are never
auto-attached.

Processes that start in a cgroup, unit or container named by ``attach --cgroup/--unit/
--container`` are attached by the rules of :mod:`memagent.core.groups`, here too.

Where the kernel's process events are heard (:mod:`memagent.core.process_events`), a
followed process's child is attached at its fork (:meth:`Scanner.adopt`) and a match at
its exec (:meth:`Scanner.on_exec`); the scan still runs, for what they missed.
"""

from __future__ import annotations

import fnmatch
import logging
import os
from collections.abc import Sequence

from ..errors import MemagentError
from ..proc.procfs import ProcFS
from .groups import Groups
from .registry import MayWatch, Registry, anyone
from .watched import Watched

log = logging.getLogger(__name__)

#: Scans during which an unmatched new PID is looked at again (fork-then-exec).
RECHECK_SCANS = 3
OWN_TOOLS = frozenset({"memagent", "memtop"})


class Scanner:
    def __init__(
        self,
        registry: Registry,
        patterns: Sequence[str] = (),
        *,
        may_watch: MayWatch = anyone,
        label: str | None = None,
        groups: Groups | None = None,
    ) -> None:
        self.registry = registry
        self.groups = groups or Groups(registry)
        self.procfs: ProcFS = registry.procfs
        self.patterns = list(patterns)
        self.may_watch = may_watch
        self.label = label
        self._seen: set[int] = set()
        self._recheck: dict[int, int] = {}
        self._own_pid = os.getpid()

    def matches(self, pid: int, comm: str) -> bool:
        if comm in OWN_TOOLS or pid == self._own_pid:
            return False
        names = [comm]
        exe = self.procfs.exe_name(pid)  # None: not ours to read, or a kernel thread
        if exe is not None:
            names.append(exe)
        return any(fnmatch.fnmatchcase(n, p) for n in names for p in self.patterns)

    def adopt(self, pid: int, parent: Watched, *, descendants: bool = True) -> list[Watched]:
        """Attach ``pid``, a child of ``parent`` (whose children are followed): with its
        label, trusted or not, and the rights of the client that asked to follow them; and,
        with ``descendants``, the children it has already. MemagentError if it cannot be."""
        may_watch = parent.follow_may_watch or self.may_watch
        watched = self.registry.attach(pid, label=parent.label, children=descendants, may_watch=may_watch)
        for w in watched:
            w.label_trusted = parent.label_trusted
            if not w.follow_children:
                w.follow_children = True
                w.follow_may_watch = may_watch
        return watched

    def on_exec(self, pid: int) -> Watched | None:
        """A process not watched ran a new program: attach it now if it matches."""
        try:
            comm = self.procfs.stat(pid).comm
            if not self.matches(pid, comm):
                return None
            return self.registry.attach(pid, label=self.label, may_watch=self.may_watch)[0]
        except MemagentError as exc:  # gone already, or not ours
            log.debug("auto-attach of %d at exec skipped: %s", pid, exc)
            return None

    def scan(self) -> int:
        """Look at new PIDs; returns how many were attached."""
        followers = {w.pid: w for w in self.registry.alive if w.follow_children}
        if not self.patterns and not followers and not self.groups.rules:
            return 0
        current = set(self.procfs.pids())
        new = (current - self._seen) | (self._recheck.keys() & current)
        self._seen = current
        attached = 0
        for pid in sorted(new):
            if self.registry.find_alive(pid) is not None:
                self._recheck.pop(pid, None)
                continue
            try:
                stat = self.procfs.stat(pid)
            except MemagentError:
                self._recheck.pop(pid, None)
                continue
            parent = followers.get(stat.ppid)
            auto = parent is None and bool(self.patterns) and self.matches(pid, stat.comm)
            rule = self.groups.rule_for(pid) if parent is None and not auto and pid != self._own_pid else None
            if parent is None and not auto and rule is None:
                left = self._recheck.get(pid, RECHECK_SCANS + 1) - 1
                if left > 0:
                    self._recheck[pid] = left
                else:
                    self._recheck.pop(pid, None)
                continue
            self._recheck.pop(pid, None)
            try:
                if parent is not None:
                    self.adopt(pid, parent)
                elif rule is not None:
                    for w in self.registry.attach(pid, label=rule.label, may_watch=rule.may_watch):
                        w.label_trusted = rule.trusted
                else:
                    self.registry.attach(pid, label=self.label, may_watch=self.may_watch)
                attached += 1
            except MemagentError as exc:
                log.debug("auto-attach of %d skipped: %s", pid, exc)
        # Forget rechecks of PIDs that are gone.
        for pid in list(self._recheck):
            if pid not in current:
                del self._recheck[pid]
        return attached
