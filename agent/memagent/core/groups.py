"""Attach by what operators name: a memory cgroup, a systemd unit, a container.

``memagent attach --cgroup PATH | --unit NAME | --container NAME|ID`` watches every process
in it now, and keeps a :class:`GroupRule` so that the scan (:mod:`memagent.core.autoattach`)
attaches the ones that start later, with the label and the rights of the client that
asked. Rules are kept across restarts with the watched set (:mod:`memagent.store.state`),
each with its owner's rights (``owner``: the UID of the client that asked, None for one that
sees all); ``memagent detach --cgroup/--unit/--container`` ends them.

What a process is in comes from its memory cgroup path (``/proc/PID/cgroup``, one small
read per process, only for PIDs new to the scan) through
:func:`~memagent.proc.cgroup_identity.parse_cgroup_identity`. A container is matched by
its ID (the whole ID, or a prefix of at least 12 hex digits, as ``docker ps`` shows it),
or by its name where the engine's files give one
(:class:`~memagent.core.containers.ContainerNames`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from memproto.text import label_problem

from ..errors import MemagentError
from ..proc.cgroup_identity import CgroupIdentity, cgroup_path, parse_cgroup_identity
from .registry import MayWatch, Registry, anyone

KINDS = ("cgroup", "unit", "container")
#: A rule's value (a path, a unit, a name) is at most this long.
MAX_VALUE = 4096
_ID_PREFIX = re.compile(r"[0-9a-f]{12,64}")


@dataclass(frozen=True)
class GroupRule:
    kind: str
    value: str
    label: str | None = None
    #: The label came from a client that sees all (see Watched.label_trusted).
    trusted: bool = True
    may_watch: MayWatch = field(default=anyone, compare=False)
    #: The UID of the client that asked, when it does not see all: the rule attaches its
    #: processes only, and only it (or root, an admin) may end it. None: one that sees all.
    owner: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value, "label": self.label, "trusted": self.trusted,
                "owner": self.owner}

    @classmethod
    def from_json(cls, data: object) -> GroupRule:
        """A saved rule, checked field by field (ValueError names the first wrong one); its
        rights are rebuilt from ``owner``."""
        if not isinstance(data, dict):
            raise ValueError("a rule is not an object")
        kind, value, label = data.get("kind"), data.get("value"), data.get("label")
        trusted, owner = data.get("trusted"), data.get("owner")
        if kind not in KINDS or not isinstance(value, str) or not value or len(value) > MAX_VALUE:
            raise ValueError(f"rule: kind {kind!r:.20} or value {value!r:.60}")
        if label is not None and (not isinstance(label, str) or label_problem(label) is not None):
            raise ValueError(f"rule label: {label!r:.60}")
        if not isinstance(trusted, bool) or not (owner is None or (type(owner) is int and owner >= 0)):
            raise ValueError(f"rule trusted {trusted!r:.10} or owner {owner!r:.20}")
        return cls(kind, value, label, trusted, anyone if owner is None else _own(owner), owner)


def _own(owner: int) -> MayWatch:
    return lambda uid: uid == owner


def matches(kind: str, value: str, path: str | None, identity: CgroupIdentity, name: str | None) -> bool:
    """Whether a process whose memory cgroup is ``path`` is in the group ``kind``/``value``."""
    if kind == "cgroup":
        top = value.rstrip("/") or "/"
        return path is not None and (path == top or top == "/" or path.startswith(top + "/"))
    if kind == "unit":
        return identity.unit == value
    cid = identity.container_id
    if cid is None:
        return False
    return (_ID_PREFIX.fullmatch(value) is not None and cid.startswith(value)) or name == value


class Groups:
    """The rules, and who is in a group now."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.rules: list[GroupRule] = []

    def add(self, rule: GroupRule) -> None:
        if rule not in self.rules:
            self.rules.append(rule)
            self.registry.edits += 1  # saved with the watched set

    def remove(self, kind: str, value: str, may_end: Callable[[GroupRule], bool]) -> int:
        """End the rules for ``kind``/``value`` that ``may_end``; how many ended."""
        kept = [r for r in self.rules if not (r.kind == kind and r.value == value and may_end(r))]
        ended, self.rules = len(self.rules) - len(kept), kept
        if ended:
            self.registry.edits += 1
        return ended

    def where(self, pid: int) -> tuple[str | None, CgroupIdentity, str | None]:
        """Its cgroup path, what that says, and its container's name if known now (a
        lookup is queued otherwise). MemagentError when it cannot be read."""
        path = cgroup_path(self.registry.procfs.memory_cgroup(pid))
        identity = parse_cgroup_identity(path)
        return path, identity, self.registry.container_names.lookup(identity)

    def rule_for(self, pid: int) -> GroupRule | None:
        """The first rule ``pid`` falls under, or None."""
        if not self.rules:
            return None
        try:
            path, identity, name = self.where(pid)
        except MemagentError:
            return None
        return next((r for r in self.rules if matches(r.kind, r.value, path, identity, name)), None)

    def members(self, kind: str, value: str, pids: Iterable[int]) -> list[int]:
        """The PIDs among ``pids`` in the group now."""
        found = []
        own = os.getpid()  # the daemon may sit in the group it is asked to watch
        for pid in pids:
            if pid == own:
                continue
            try:
                path, identity, name = self.where(pid)
            except MemagentError:
                continue  # gone, or not readable: not a member we can watch
            if matches(kind, value, path, identity, name):
                found.append(pid)
        return found

    def host_pid(self, members: Iterable[int], ns_pid: int) -> int | None:
        """The member whose PID inside its namespace is ``ns_pid`` (``attach --container web
        1``: the container's PID 1), or None."""
        return next((pid for pid in members if self.registry.procfs.ns_pid(pid) == ns_pid), None)

    def identities(self, pids: Iterable[int]) -> list[CgroupIdentity]:
        """The distinct containers of ``pids`` (to look their names up before matching)."""
        seen: dict[str, CgroupIdentity] = {}
        for pid in pids:
            try:
                _, identity, _ = self.where(pid)
            except MemagentError:
                continue
            if identity.container_id is not None:
                seen.setdefault(identity.container_id, identity)
        return list(seen.values())
