"""``list``: the watched processes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..records.process import ProcessInfo
from ..schema import wire
from .session import Frame


@wire
@dataclass(frozen=True, slots=True)
class ListProcesses(Frame):
    """List the watched processes the caller may see."""

    TYPE: ClassVar[str] = "list"
    id: int


@wire
@dataclass(frozen=True, slots=True)
class ListOk(Frame):
    """Reply to ``list``."""

    TYPE: ClassVar[str] = "list_ok"
    id: int
    processes: list[ProcessInfo]
