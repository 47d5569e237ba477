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
from collections.abc import Callable, Iterable, Iterator
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


def _index_key(rule: GroupRule) -> tuple[str, str]:
    """What a rule is found by: its unit, its cgroup path without a trailing slash, its
    container ID prefix or name (a value that is both is found either way: see
    :func:`_candidates`)."""
    if rule.kind == "cgroup":
        return "cgroup", rule.value.rstrip("/") or "/"
    return rule.kind, rule.value


def _candidates(path: str | None, identity: CgroupIdentity, name: str | None) -> Iterator[tuple[str, str]]:
    """The index keys whose rules may match a process in ``path``: the path and each of
    its ancestors, its unit, its container's ID prefixes (12 hex digits and longer) and
    name. A few dozen look-ups, whatever the number of rules."""
    if path is not None:
        yield "cgroup", "/"
        yield "cgroup", path
        for i in range(1, len(path)):
            if path[i] == "/":
                yield "cgroup", path[:i]
    if identity.unit is not None:
        yield "unit", identity.unit
    cid = identity.container_id
    if cid is not None:
        for end in range(12, len(cid) + 1):
            yield "container", cid[:end]
        if name is not None:
            yield "container", name


class Groups:
    """The rules, and who is in a group now.

    Bounded (docs/security.md "Attach rules without end"): a client that does not see all
    keeps at most ``max_per_uid`` rules, all such users together at most ``max_rules``;
    root and the admin group (rules with no ``owner``) have a pool of ``max_rules`` of
    their own, which no user's rules can fill. Rules are indexed by what they match (the
    unit, the cgroup path, the container's ID or name), so finding a new process's rule
    costs a few dictionary look-ups, not one match per rule: a restart with every rule
    there is still allowed stays linear."""

    def __init__(self, registry: Registry, max_per_uid: int = 64, max_rules: int = 1024) -> None:
        self.registry = registry
        self.max_per_uid = max_per_uid
        self.max_rules = max_rules
        #: Every rule, in the order it was made (the first one a process falls under wins),
        #: with its sequence number.
        self._order: dict[GroupRule, int] = {}
        self._next = 0
        #: (kind, what it matches) -> the rules for it.
        self._index: dict[tuple[str, str], list[GroupRule]] = {}
        #: Rules per owner (None: root and admins).
        self._per_owner: dict[int | None, int] = {}

    @property
    def rules(self) -> list[GroupRule]:
        return list(self._order)

    @property
    def kept(self) -> int:
        """How many rules there are (a Groups is never falsy: callers test ``is None``)."""
        return len(self._order)

    def count(self, owner: int | None) -> int:
        """The rules ``owner`` keeps (None: root and admins together)."""
        return self._per_owner.get(owner, 0)

    def refusal(self, rule: GroupRule) -> str | None:
        """Why ``rule`` may not be added now (its owner, or all users, at the cap); None
        when it may (a rule kept already is never refused: adding it changes nothing)."""
        if rule in self._order:
            return None
        if rule.owner is None:
            if self.count(None) >= self.max_rules:
                return (f"{self.max_rules} group rules of root and admin_group kept already "
                        "(clients.max_rules); end one with memagent detach --cgroup/--unit/--container")
            return None
        if self.count(rule.owner) >= self.max_per_uid:
            return (f"uid {rule.owner} keeps {self.max_per_uid} group rules already (clients.max_rules_per_uid); "
                    "end one with memagent detach --cgroup/--unit/--container")
        if self.kept - self.count(None) >= self.max_rules:
            return f"{self.max_rules} group rules of users kept already (clients.max_rules)"
        return None

    def add(self, rule: GroupRule) -> bool:
        """Keep ``rule`` (unless kept already); whether it is new. The caller checks
        :meth:`refusal` first."""
        if rule in self._order:
            return False
        self._order[rule] = self._next
        self._next += 1
        self._index.setdefault(_index_key(rule), []).append(rule)
        self._per_owner[rule.owner] = self.count(rule.owner) + 1
        self.registry.edits += 1  # saved with the watched set
        return True

    def take_back(self, rules: Iterable[GroupRule]) -> int:
        """The saved rules, in order, each user's first ones while under the caps (root's
        and admins' all: never dropped); how many were left out (a file saved under larger
        caps, or by a version without them)."""
        dropped = 0
        for rule in rules:
            if rule.owner is not None and self.refusal(rule) is not None:
                dropped += 1
                continue
            self.add(rule)
        return dropped

    def _drop(self, rule: GroupRule) -> None:
        del self._order[rule]
        key = _index_key(rule)
        same = self._index[key]
        same.remove(rule)
        if not same:
            del self._index[key]
        self._per_owner[rule.owner] -= 1

    def remove(self, kind: str, value: str, may_end: Callable[[GroupRule], bool]) -> int:
        """End the rules for ``kind``/``value`` that ``may_end``; how many ended."""
        probe = GroupRule(kind, value)
        ending = [r for r in self._index.get(_index_key(probe), []) if r.value == value and may_end(r)]
        for rule in ending:
            self._drop(rule)
        if ending:
            self.registry.edits += 1
        return len(ending)

    def where(self, pid: int) -> tuple[str | None, CgroupIdentity, str | None]:
        """Its cgroup path, what that says, and its container's name if known now (a
        lookup is queued otherwise). MemagentError when it cannot be read."""
        path = cgroup_path(self.registry.procfs.memory_cgroup(pid))
        identity = parse_cgroup_identity(path)
        return path, identity, self.registry.container_names.lookup(identity)

    def rule_for(self, pid: int) -> GroupRule | None:
        """The first rule ``pid`` falls under, or None."""
        if not self._order:
            return None
        try:
            path, identity, name = self.where(pid)
        except MemagentError:
            return None
        return self.first_rule(path, identity, name)

    def first_rule(self, path: str | None, identity: CgroupIdentity, name: str | None) -> GroupRule | None:
        """The first rule (in the order they were made) that a process in ``path`` falls
        under: the same as trying :func:`matches` with each rule, found through the index."""
        found = [r for key in _candidates(path, identity, name) for r in self._index.get(key, ())
                 if matches(r.kind, r.value, path, identity, name)]
        return min(found, key=self._order.__getitem__, default=None)

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
