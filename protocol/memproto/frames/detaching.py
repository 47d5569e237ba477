"""``detach``: stop watching them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..records.process import Failure, ProcessRef
from ..schema import wire
from .session import Frame


@wire
@dataclass(frozen=True, slots=True)
class Detach(Frame):
    """Stop watching these PIDs (or a group's rule)."""

    TYPE: ClassVar[str] = "detach"
    id: int
    pids: list[int]
    #: Also detach every exited process the caller may see.
    exited: bool = False
    #: v1.7: end the rule of ``attach`` for this group, and detach its processes now.
    cgroup: str | None = None
    unit: str | None = None
    container: str | None = None


@wire
@dataclass(frozen=True, slots=True)
class DetachOk(Frame):
    """Reply to ``detach``: the processes no longer watched and the PIDs refused."""

    TYPE: ClassVar[str] = "detach_ok"
    id: int
    detached: list[ProcessRef]
    failed: list[Failure]
    #: v1.7: group rules ended (``detach`` with cgroup, unit or container).
    rules_ended: int = 0
