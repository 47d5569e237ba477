"""The set of watched processes: attach, detach, reset peaks, and their bounds.

Authorisation is not decided here: callers pass ``may_watch(uid)`` so that the same
registry serves the root daemon, an unprivileged daemon and the embedded agent.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from memproto.series import PeakSeries
from memproto.text import printable
from memproto.units import format_size

from ..errors import AccessDenied, MemagentError, NoSuchProcess
from ..proc.cgroup_identity import parse_cgroup_identity
from ..proc.cgroups import oom_kill_count
from ..proc.lifecycle import GoneHandle, reaped
from ..proc.procfs import ProcFS
from .containers import ContainerNames
from .oom import OomScores
from .watched import Watched

log = logging.getLogger(__name__)

MayWatch = Callable[[int], bool]


def anyone(uid: int) -> bool:
    return True


class Events(Protocol):
    """What the registry tells the outside world (the server turns these into frames)."""

    def attached(self, w: Watched) -> None: ...
    def exited(self, w: Watched) -> None: ...
    def detached(self, w: Watched) -> None: ...


class NoEvents:
    def attached(self, w: Watched) -> None:
        pass

    def exited(self, w: Watched) -> None:
        pass

    def detached(self, w: Watched) -> None:
        pass


class Registry:
    def __init__(
        self,
        procfs: ProcFS | None = None,
        *,
        history_step: float = 1.0,
        history_seconds: float = 600.0,
        max_exited: int = 256,
        events: Events | None = None,
        container_names: ContainerNames | None = None,
        oom: OomScores | None = None,
    ) -> None:
        self.procfs = procfs or ProcFS()
        self.history_step = history_step
        self.history_slots = max(1, int(history_seconds / history_step))
        self.max_exited = max_exited
        #: Whose exited entries go last when the slots are full: root's and the daemon's own.
        self.privileged_uids = frozenset({0, os.getuid()})
        self.events: Events = events or NoEvents()
        #: Insertion-ordered: attach order, which keeps sample rows stable.
        self.entries: dict[tuple[int, int], Watched] = {}
        #: The live subset, rebuilt on change; the sampler iterates it every tick.
        self.alive: list[Watched] = []
        #: Bumped on every attach, detach and exit: lets consumers skip unchanged ticks.
        self.version = 0
        #: Bumped on every change the saved state holds (memagent.store.state): the set, as
        #: :attr:`version`, and a label, children-following or a peak window changed.
        self.edits = 0
        #: Container names (memagent.core.containers); without one, names are not looked up.
        self.container_names = container_names or ContainerNames(None)
        #: The ``[oom_score_adj]`` table (memagent.core.oom): an entry detached gets its own back.
        self.oom = oom or OomScores()

    # ----------------------------------------------------------------- queries

    def find(self, pid: int) -> list[Watched]:
        return [w for w in self.entries.values() if w.pid == pid]

    def find_alive(self, pid: int) -> Watched | None:
        """The newest live entry of ``pid``: after its PID was reused, a process's entry
        stays live until the next tick finds it gone, beside the new process's."""
        for w in reversed(self.alive):
            if w.pid == pid:
                return w
        return None

    def rows(self) -> tuple[list[tuple[object, ...]], list[int]]:
        """The sample row of every watched process in attach order (each rebuilt when its
        figures changed), and each row's owner UID: what a tick broadcasts and records."""
        entries = self.entries.values()
        return [w.row for w in entries], [w.uid for w in entries]

    def visible(self, may_watch: MayWatch = anyone) -> list[Watched]:
        return [w for w in self.entries.values() if may_watch(w.uid)]

    def _rebuild_alive(self) -> None:
        self.alive = [w for w in self.entries.values() if w.alive]
        self.version += 1
        self.edits += 1

    # ----------------------------------------------------------------- changes

    def attach(
        self,
        pid: int,
        *,
        label: str | None = None,
        children: bool = False,
        may_watch: MayWatch = anyone,
        now: float | None = None,
    ) -> list[Watched]:
        """Watch ``pid`` (and with ``children`` its descendants, first ``pid``).

        Idempotent: attaching a watched process updates its label. Raises NoSuchProcess,
        AccessDenied or NotUserProcess for ``pid``; nothing is kept then. A descendant
        that cannot be attached is skipped.
        """
        now = time.time() if now is None else now
        w = self._attach_one(pid, label, children, may_watch, now)
        out = [w]
        if children:
            for child in self.descendants(pid):
                try:
                    out.append(self._attach_one(child, label, True, may_watch, now))
                except MemagentError as exc:  # a child that just exited, or not ours
                    log.debug("child %d of %d not attached: %s", child, pid, exc)
        return out

    def _attach_one(self, pid: int, label: str | None, children: bool, may_watch: MayWatch, now: float) -> Watched:
        existing = self.find_alive(pid)
        if existing is not None and reaped(existing.handle):
            existing = None  # its PID is another process's now: that one is attached anew
        if existing is not None:
            if not may_watch(existing.uid):
                raise AccessDenied(pid)
            if label is not None and label != existing.label:
                existing.label = label
                self.edits += 1
            if children and not existing.follow_children:
                existing.follow_children = True
                existing.follow_may_watch = may_watch
                self.edits += 1
            return existing
        handle = self.procfs.open(pid)
        # Until the entry is registered, the handle's three descriptors are ours alone: any
        # failure on the way (an unreadable fact, a refusal, garbage in /proc) closes them.
        try:
            facts = handle.facts()
            if not may_watch(facts.uid):
                raise AccessDenied(pid)
            w = Watched(
                handle,
                start_time=self.procfs.start_time(pid, handle.starttime),
                name=facts.stat.comm,
                cmdline=facts.cmdline,
                uid=facts.uid,
                label=label,
                attached_at=now,
                history=PeakSeries(self.history_step, self.history_slots),
            )
            w.set_memory(facts.statm.resident, facts.statm.shared, facts.memory.hwm_bytes,
                         facts.memory.swap_bytes)
            w.history.add(now, w.rss)
            w.follow_children = children
            w.follow_may_watch = may_watch if children else None
            w.memory_reader = facts.access.reader
            w.ns_pid = facts.ns_pid
            w.cgroup = self.procfs.memory_cgroup(pid)
            w.oom_count = oom_kill_count(w.cgroup)
            identity = parse_cgroup_identity(w.cgroup_path)
            w.set_identity(identity, self.container_names.lookup(identity))
        except BaseException:
            handle.close()
            raise
        self.entries[w.key] = w
        self._rebuild_alive()
        log.info("attached %d (%s)%s", pid, printable(facts.stat.comm), f" as {printable(label)}" if label else "")
        self.events.attached(w)
        return w

    def add_gone(self, pid: int, starttime: int, *, name: str, uid: int, label: str | None, label_trusted: bool,
                 hwm: int, now: float) -> Watched | None:
        """An entry for a process reaped before it could be opened (a followed parent's
        child, known from its exit record only: ``hwm``, its exact final peak), added as
        exited; None when an entry has that identity already."""
        if (pid, starttime) in self.entries:
            return None
        w = Watched(GoneHandle(pid, starttime), start_time=self.procfs.unix_start_time(starttime), name=name,
                    cmdline=[], uid=uid, label=label, attached_at=now,
                    history=PeakSeries(self.history_step, self.history_slots))
        w.label_trusted = label_trusted
        w.take_exit_hwm(hwm)
        w.mark_exited(now)
        self.insert_exited(w)
        log.info("%d (%s) exited before it could be opened; peak %s (its exit record)", pid,
                 printable(label or name), format_size(hwm, long=True))
        return w

    def new_history(self) -> PeakSeries:
        return PeakSeries(self.history_step, self.history_slots)

    def insert_exited(self, w: Watched) -> None:
        """Keep ``w``, already exited (a process known only from its exit record, or from
        the saved state), as every exited entry is kept: announced, and within the bound."""
        self.entries[w.key] = w
        self._rebuild_alive()
        self.events.attached(w)
        self.events.exited(w)
        self._bound_exited()

    def descendants(self, pid: int) -> list[int]:
        """PIDs whose parent chain reaches ``pid`` (read from /proc now)."""
        parent_of: dict[int, int] = {}
        for p in self.procfs.pids():
            try:
                parent_of[p] = self.procfs.stat(p).ppid
            except MemagentError:
                continue
        found: list[int] = []
        frontier = {pid}
        while frontier:
            nxt = {p for p, pp in parent_of.items() if pp in frontier}
            found.extend(sorted(nxt))
            frontier = nxt
        return found

    def detach(self, pid: int, may_watch: MayWatch = anyone) -> list[Watched]:
        """Stop watching every entry with this PID (a live one and exited ones).

        Entries the caller may not see are, for it, not watched: no existence leak.
        """
        matches = [w for w in self.find(pid) if may_watch(w.uid)]
        if not matches:
            raise NoSuchProcess(pid, "not watched")
        for w in matches:
            self._remove(w)
        return matches

    def detach_exited(self, may_watch: MayWatch = anyone) -> list[Watched]:
        gone = [w for w in self.entries.values() if not w.alive and may_watch(w.uid)]
        for w in gone:
            self._remove(w)
        return gone

    def _remove(self, w: Watched) -> None:
        del self.entries[w.key]
        if w.alive:
            self.oom.release(w)
            w.handle.close()
        self._rebuild_alive()
        log.info("detached %d (%s)", w.pid, printable(w.display))
        self.events.detached(w)

    def live(self, pid: int, may_watch: MayWatch = anyone) -> Watched:
        """The live entry of ``pid`` the caller may see; NoSuchProcess (exited, or not
        watched: an entry the caller may not see counts as not watched)."""
        w = self.find_alive(pid)
        if w is None or not may_watch(w.uid):
            if any(may_watch(e.uid) for e in self.find(pid)):
                raise NoSuchProcess(pid, "exited")
            raise NoSuchProcess(pid, "not watched")
        return w

    def reset_peaks(self, pid: int, may_watch: MayWatch = anyone, now: float | None = None,
                    kernel: bool = False) -> Watched:
        """A new peak window (see :mod:`.watched`). ``kernel``: also reset the kernel's VmHWM
        (clear_refs), which resets the target's own ``ru_maxrss``; whether the caller may
        ask for that is the caller's rule. Where the kernel refuses, the window restarts
        on the agent's side as without ``kernel``."""
        w = self.live(pid, may_watch)
        now = time.time() if now is None else now
        kernel_reset = False
        if kernel:
            try:
                w.handle.clear_refs()
                kernel_reset = True
            except AccessDenied:
                log.warning("pid %d: kernel peak not resettable (clear_refs denied); window restarted "
                            "on the agent's side", pid)
        statm, mem = w.handle.memory()
        w.restart_window(now, kernel_reset, statm.resident, statm.shared, mem.hwm_bytes)
        self.edits += 1
        return w

    def refresh_program(self, w: Watched) -> bool:
        """``w`` ran a new program (its exec event), or its name changed under the sampler's
        eyes (the /proc/PID/status ``Name:`` line, as after an exec the events missed): its
        name and command line are read again and, when they changed, announced again as an
        ``attached`` event with the same identity (docs/protocol.md 9.2). Its label is kept:
        a label names the process, not the program, and an auto-attach label is rendered
        once, at its attach. Also read again: who may read its memory (a set-user-ID
        program's is root's). False when nothing changed, or it is gone already."""
        try:
            facts = w.handle.facts()
        except MemagentError:  # exited, or its PID another's: the sampler will tell
            return False
        w.memory_reader = facts.access.reader
        if (facts.stat.comm, facts.cmdline) == (w.name, w.cmdline):
            return False
        log.info("%d (%s) runs %s now", w.pid, printable(w.name), printable(facts.stat.comm))
        w.name, w.cmdline = facts.stat.comm, facts.cmdline
        self.edits += 1
        self.events.attached(w)
        return True

    def mark_exited(self, gone: list[Watched], now: float) -> None:
        """Processes found exited in one tick: one rebuild, however many there are."""
        for w in gone:
            w.exit_signal = w.handle.exit_signal()  # a zombie still tells how it died
            w.mark_exited(now)
            log.info("%d (%s) exited; peak %s%s", w.pid, printable(w.display), format_size(w.peak, long=True),
                     "" if w.peak_known_exact else " (no exit record: may have grown after the last read)")
        self._rebuild_alive()
        for w in gone:
            self.events.exited(w)
        self._bound_exited()

    def _bound_exited(self) -> None:
        """At most :attr:`max_exited` exited entries, shared by UID: past the bound, the
        oldest exited entry of the UID that holds the most goes (root's and the daemon's
        own UID only once no other UID holds any). One user's churn of short-lived
        processes so only ever evicts its own entries while others hold fewer: root's
        killed model keeps its exited entry, and its peak, however fast another user churns."""
        exited = [w for w in self.entries.values() if not w.alive]
        excess = len(exited) - self.max_exited
        if excess <= 0:
            return
        exited.sort(key=lambda w: w.exited_at or 0.0)
        held = Counter(w.uid for w in exited)
        by_uid: dict[int, list[Watched]] = {}
        for w in exited:
            by_uid.setdefault(w.uid, []).append(w)
        evicted: list[Watched] = []
        for _ in range(excess):
            uid = max(held, key=lambda u: (u not in self.privileged_uids, held[u]))
            evicted.append(by_uid[uid].pop(0))
            held[uid] -= 1
            if not held[uid]:
                del held[uid]
        for w in evicted:
            self._remove(w)

    def judge_oom(self) -> None:
        """Each live entry's ``[oom_score_adj]`` judged again when the set or a label
        changed (memagent.core.oom); an original kept or given back is an edit (saved)."""
        if self.oom.sync(self.alive, self.edits):
            self.edits += 1
            self.oom.judged_at = self.edits

    def close(self) -> None:
        """Stop watching everything (a stop): each process's own oom_score_adj given back."""
        self.oom.release_all(self.alive)
        for w in self.entries.values():
            if w.alive:
                w.handle.close()
        self.entries.clear()
        self.alive = []
