"""``reset_peaks``: start a new peak window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..records.process import Failure, ProcessInfo
from ..schema import wire
from .session import Frame


@wire
@dataclass(frozen=True, slots=True)
class ResetPeaks(Frame):
    """Start a new peak window for these PIDs."""

    TYPE: ClassVar[str] = "reset_peaks"
    id: int
    pids: list[int]
    #: Also reset the kernel's VmHWM (clear_refs): exact at once, but it resets the
    #: target's own ru_maxrss; refused for PID 1 and processes not the caller's own.
    kernel: bool = False


@wire
@dataclass(frozen=True, slots=True)
class ResetPeaksOk(Frame):
    """Reply to ``reset_peaks``: the processes whose window restarted and the PIDs refused."""

    TYPE: ClassVar[str] = "reset_peaks_ok"
    id: int
    reset: list[ProcessInfo]
    failed: list[Failure]
