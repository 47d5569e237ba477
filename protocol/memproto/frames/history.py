"""``history``: the RSS series kept."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..records.history import Series
from ..schema import wire
from .session import Frame


@wire
@dataclass(frozen=True, slots=True)
class History(Frame):
    """The peak-preserving RSS history of processes."""

    TYPE: ClassVar[str] = "history"
    id: int
    #: Empty: every process the caller may see.
    pids: list[int] = field(default_factory=list)
    #: How far back; nil: everything kept.
    seconds: float | None = None


@wire
@dataclass(frozen=True, slots=True)
class HistoryOk(Frame):
    """Reply to ``history``: one series per process, ``step`` seconds a slot."""

    TYPE: ClassVar[str] = "history_ok"
    id: int
    step: float
    series: list[Series]
