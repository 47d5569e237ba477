"""``status``: the daemon's status."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..records.status import DaemonStatus
from ..schema import wire
from .session import Frame


@wire
@dataclass(frozen=True, slots=True)
class Status(Frame):
    """The daemon's status."""

    TYPE: ClassVar[str] = "status"
    id: int


@wire
@dataclass(frozen=True, slots=True)
class StatusOk(Frame):
    """Reply to ``status``."""

    TYPE: ClassVar[str] = "status_ok"
    id: int
    status: DaemonStatus
