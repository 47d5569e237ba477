"""``stack``: Python stacks, and the event of a stack state's change."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..records.stacks import GrowthSite, StackDump
from ..schema import wire
from .session import Frame


@wire
@dataclass(frozen=True, slots=True)
class Stack(Frame):
    """v1.2: the Python stacks of a watched process. With ``fresh`` the agent takes a new
    dump first (within its dump budget) and replies when it has it."""

    TYPE: ClassVar[str] = "stack"
    id: int
    pid: int
    fresh: bool = True


@wire
@dataclass(frozen=True, slots=True)
class StackOk(Frame):
    """Reply to ``stack`` (v1.2): the latest stack, the stack at the peak and the growth sites."""

    TYPE: ClassVar[str] = "stack_ok"
    id: int
    pid: int
    start_time: float
    #: "ok", "pending", "not_python", "permission_denied", "py_spy_missing", "unsupported",
    #: "exited", "timeout", "error" or "disabled".
    state: str
    #: What went wrong and how to fix it, or nil.
    message: str | None
    latest: StackDump | None
    at_peak: StackDump | None
    by_line: list[GrowthSite]
    by_function: list[GrowthSite]
    #: v1.7: "ok" (``at_peak`` was taken while memory rose to the peak), "missed" (no stack
    #: was taken during that rise: ``at_peak`` is nil), nil (no rise to a new peak seen yet).
    stack_at_peak_state: str | None = None


@wire
@dataclass(frozen=True, slots=True)
class StackStateChanged(Frame):
    """v1.2: a watched process's stack state changed (e.g. to "permission_denied")."""

    TYPE: ClassVar[str] = "stack_state"
    pid: int
    start_time: float
    state: str
    message: str | None
