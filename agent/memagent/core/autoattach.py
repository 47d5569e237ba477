"""Auto-attach: watch every process, existing or new, whose executable name matches a
pattern, and the children of processes attached with ``--children``.

A scan lists ``/proc`` (~120 µs for 1000 processes) and looks only at PIDs it has not
seen before. A process caught between ``fork`` and ``exec`` still carries its parent's
name, so an unmatched new PID is looked at again on the next few scans.

Matched names: the kernel's ``comm`` and the basename of ``/proc/PID/exe`` (fnmatch,
case-sensitive). The agent's own process and the memagent/memtop tools are never
auto-attached.
"""

from __future__ import annotations

import fnmatch
import logging
import os
from collections.abc import Sequence

from ..errors import MemagentError
from ..proc.procfs import ProcFS
from .registry import MayWatch, Registry, anyone

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
    ) -> None:
        self.registry = registry
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

    def scan(self) -> int:
        """Look at new PIDs; returns how many were attached."""
        followers = {w.pid: w for w in self.registry.alive if w.follow_children}
        if not self.patterns and not followers:
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
            label = self.label
            may_watch = self.may_watch
            if parent is not None:
                label = parent.label
                may_watch = parent.follow_may_watch or self.may_watch
            elif not (self.patterns and self.matches(pid, stat.comm)):
                left = self._recheck.get(pid, RECHECK_SCANS + 1) - 1
                if left > 0:
                    self._recheck[pid] = left
                else:
                    self._recheck.pop(pid, None)
                continue
            self._recheck.pop(pid, None)
            try:
                watched = self.registry.attach(pid, label=label, children=parent is not None, may_watch=may_watch)
                if parent is not None:  # a child carries its parent's label, trusted or not
                    for w in watched:
                        w.label_trusted = parent.label_trusted
                attached += 1
            except MemagentError as exc:
                log.debug("auto-attach of %d skipped: %s", pid, exc)
        # Forget rechecks of PIDs that are gone.
        for pid in list(self._recheck):
            if pid not in current:
                del self._recheck[pid]
        return attached
