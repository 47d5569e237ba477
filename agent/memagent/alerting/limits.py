"""Memory cgroup limits as headroom resources of their own (docs/headroom.md, "A cgroup's
limit").

A container, or a systemd unit with ``MemoryMax``, whose memory cgroup has a limit
cannot use more than that however much the box has free: the kernel OOM-kills inside it
first. So each memory cgroup that holds live watched processes, itself or in a cgroup
below it, and has a limit below the box's total memory, is a resource of its own: Σ of
the share-adjusted peaks of the watched processes at or below it, against its limit less
what the processes there that are not watched use (:func:`.headroom.cgroup_headroom`).
Its id is ``cgroup:PATH`` (:class:`memproto.vocabulary.Resource`), its name the
container's (``docker web``), else the pod's, else the systemd unit's, else the path.

The kernel files are read through :mod:`memagent.proc.cgroups`, off the tick's hot
path: the limits of the live watched processes' cgroups and of the cgroups above them
every :data:`LIMITS_EVERY` seconds, and at once when a process in a cgroup not yet
looked at is attached (a limit rarely changes); the working sets of the limited ones at
most every :data:`USAGE_EVERY` seconds. A file that is there but does not parse is a
one-line fault (the status's ``faults``, logged once), never an error: that cgroup then
counts as unlimited, or its unwatched use as unknown (0).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from memproto.records import Headroom
from memproto.vocabulary import Resource

from ..core.registry import Registry
from ..core.watched import Watched
from ..proc.cgroup_identity import cgroup_path, parse_cgroup_identity, pod_uid
from ..proc.cgroups import ROOT, ancestors, memory_limit, working_set
from .headroom import CgroupInputs, cgroup_headroom

log = logging.getLogger(__name__)

#: Seconds between two reads of the limits (and on each attach into a new cgroup).
LIMITS_EVERY = 5.0
#: Seconds between two reads of the limited cgroups' working sets.
USAGE_EVERY = 1.0


class CgroupLimits:
    """The limited cgroups above the watched processes, and their headroom views."""

    def __init__(self, registry: Registry, root: str = ROOT) -> None:
        """``root``: where the cgroup file systems are mounted (a fixture tree in tests)."""
        self.registry = registry
        self.root = root
        #: Limited cgroup (as :meth:`ProcFS.memory_cgroup` names it) -> its limit.
        self.limits: dict[str, int] = {}
        #: Per resource of the last :meth:`views`: the watched processes it holds, and
        #: how an alert names it (``container web``, ``unit x.service``, ``cgroup /p``).
        self.members: dict[str, list[Watched]] = {}
        self.subjects: dict[str, str] = {}
        self._looked: set[str] = set()
        self._version = -1
        self._next = 0.0
        self._next_used = 0.0
        self._used: dict[str, int | None] = {}
        #: A cgroup -> the limited cgroups it is in (itself included), for the last limits.
        self._homes: dict[str, list[str]] = {}
        self._faults: dict[str, str] = {}
        self._used_faults: dict[str, str] = {}

    @property
    def faults(self) -> list[str]:
        """What could not be read at the last try, one line each (status ``faults``)."""
        return sorted({*self._faults.values(), *self._used_faults.values()})

    def refresh(self, now: float, total: int) -> None:
        """Read the limits again when due, or when a process in a cgroup not looked at yet
        was attached (a check only when the set of processes changed). ``total``: the
        box's memory; a limit at or above it is no limit (0: not known, every limit counts)."""
        alive = self.registry.alive
        if now < self._next:
            if self.registry.version == self._version:
                return
            self._version = self.registry.version
            if all(w.cgroup is None or w.cgroup in self._looked for w in alive):
                return
        self._next, self._version = now + LIMITS_EVERY, self.registry.version
        looked = {w.cgroup for w in alive if w.cgroup is not None}
        limits: dict[str, int] = {}
        faults: dict[str, str] = {}
        seen: set[str] = set()
        for group in looked:
            for cgroup in ancestors(group):
                if cgroup in seen:
                    break  # and so were those above it
                seen.add(cgroup)
                read = memory_limit(cgroup, self.root)
                if read.fault is not None:
                    faults[cgroup] = read.fault
                if read.value is not None and (total <= 0 or read.value < total):
                    limits[cgroup] = read.value
        if set(limits) != set(self.limits):
            self._next_used = 0.0  # a new one: its working set at once
        self._looked, self.limits, self._homes = looked, limits, {}
        self._faults = _noted(self._faults, faults)

    def views(self, now: float, watched: Iterable[Watched]) -> list[Headroom]:
        """One headroom per limited cgroup, by path; ``watched``: every watched process
        (exited ones count, as on the host, until detached)."""
        if not self.limits:
            self.members, self.subjects = {}, {}
            return []
        if now >= self._next_used:
            self._next_used = now + USAGE_EVERY
            faults: dict[str, str] = {}
            self._used = {}
            for cgroup in self.limits:
                read = working_set(cgroup, self.root)
                self._used[cgroup] = read.value
                if read.fault is not None:
                    faults[cgroup] = read.fault
            self._used_faults = _noted(self._used_faults, faults)
        held: dict[str, list[Watched]] = {cgroup: [] for cgroup in self.limits}
        for w in watched:
            if w.cgroup is not None:
                for cgroup in self._home(w.cgroup):
                    held[cgroup].append(w)
        views, self.members, self.subjects = [], {}, {}
        for cgroup in sorted(held, key=lambda c: c.partition(":")[2]):
            mine = held[cgroup]
            if not any(w.alive for w in mine):
                continue  # its processes exited since the limits were read
            resource = Resource.CGROUP_PREFIX + (cgroup_path(cgroup) or "/")
            name, subject = names(cgroup, mine)
            self.members[resource], self.subjects[resource] = mine, subject
            views.append(cgroup_headroom(CgroupInputs(resource, name, self.limits[cgroup], self._used.get(cgroup)),
                                         mine))
        return views

    def _home(self, cgroup: str) -> list[str]:
        home = self._homes.get(cgroup)
        if home is None:
            home = self._homes[cgroup] = [c for c in ancestors(cgroup) if c in self.limits]
        return home


def names(cgroup: str, members: list[Watched]) -> tuple[str, str]:
    """A limited cgroup's ``Headroom.name`` and how an alert names it: its container
    (``docker web``, ``container web``; the ID's first 12 digits until the name is
    known), a pod's cgroup (``kubernetes pod NS/POD``), its systemd unit, else its path."""
    path = cgroup_path(cgroup) or "/"
    identity = parse_cgroup_identity(path)
    cid = identity.container_id
    if identity.runtime is not None and cid is not None:
        known = next((w.container.name for w in members
                      if w.container is not None and w.container.id == cid and w.container.name), None)
        label = known or cid[:12]
        return f"{identity.runtime} {label}", f"container {label}"
    uid = pod_uid(path)
    if uid is not None:
        pods = {w.container.name.rsplit("/", 1)[0] for w in members
                if w.identity.pod_uid == uid and w.container is not None and w.container.name}
        label = pods.pop() if len(pods) == 1 else uid
        return f"kubernetes pod {label}", f"pod {label}"
    if identity.unit is not None and path.rstrip("/").endswith("/" + identity.unit):
        return identity.unit, f"unit {identity.unit}"
    return path, f"cgroup {path}"


def _noted(old: dict[str, str], new: dict[str, str]) -> dict[str, str]:
    """Log each fault once when it starts, and when it ends."""
    for key, fault in new.items():
        if old.get(key) != fault:
            log.warning("cgroup limit: %s", fault)
    for key in old.keys() - new.keys():
        log.info("cgroup limit: %s readable again", old[key].partition(":")[0])
    return new
