"""``attach``: watch processes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..records.process import Failure, ProcessInfo
from ..schema import wire
from .session import Frame


@wire
@dataclass(frozen=True, slots=True)
class Attach(Frame):
    """Watch these PIDs (and, with ``children`` or a group, more)."""

    TYPE: ClassVar[str] = "attach"
    id: int
    pids: list[int]
    label: str | None = None
    #: Also watch the current descendants, and follow children forked later.
    children: bool = False
    #: v1.7, at most one: also every process, now and later, whose memory cgroup is this
    #: path or below it / whose systemd unit is this / in this container (name, or ID or
    #: its first 12+ hex digits).
    cgroup: str | None = None
    unit: str | None = None
    container: str | None = None


@wire
@dataclass(frozen=True, slots=True)
class AttachOk(Frame):
    """Reply to ``attach``: the processes now watched and the PIDs refused."""

    TYPE: ClassVar[str] = "attach_ok"
    id: int
    attached: list[ProcessInfo]
    failed: list[Failure]
