"""Python stacks read from outside, and the growth they are credited with."""

from __future__ import annotations

from dataclasses import dataclass

from ..schema import wire


@wire
@dataclass(frozen=True, slots=True)
class StackFrame:
    """One Python frame (v1.2). ``name`` and ``filename`` are data from the target:
    render them as plain text, never as markup."""

    name: str
    filename: str
    line: int


@wire
@dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread's Python stack in a :class:`StackDump`."""

    thread_id: int
    name: str | None
    #: py-spy's view: the thread was running (not idle) when read.
    active: bool
    owns_gil: bool
    #: Innermost first.
    frames: list[StackFrame]
    #: v1.7: the kernel's thread ID (``/proc/PID/task/TID``); nil when unknown.
    os_thread_id: int | None = None


@wire
@dataclass(frozen=True, slots=True)
class StackDump:
    """The Python stacks of a process at one moment, read from outside with py-spy."""

    time: float
    #: Why it was taken: "growth", "peak", "demand" or "rotation".
    trigger: str
    rss_bytes: int
    vram_bytes: int | None
    threads: list[ThreadStack]
    #: The thread that growth was attributed to (v1.7: the one given the largest share of
    #: the growth; v1.2 to v1.6: the active one, else the main thread).
    attributed_thread: int | None = None
    #: v1.7: how much the RSS rose while the dump was read (bytes, RSS read just after the
    #: dump minus just before; may be negative); nil when not measured (an older agent).
    #: Positive: the stack was taken while memory was rising.
    rss_rise: int | None = None

    def attributed(self) -> ThreadStack | None:
        """The thread that ``attributed_thread`` names; None when none is named."""
        return next((t for t in self.threads if t.thread_id == self.attributed_thread), None)


@wire
@dataclass(frozen=True, slots=True)
class GrowthSite:
    """Memory growth attributed to code: the sum of the positive RSS and VRAM deltas
    between ticks, each assigned to the first stack taken after it (correlation, not
    causation: see docs/stacks.md). ``line`` is nil in the by-function table."""

    function: str
    filename: str
    line: int | None
    bytes: int
    samples: int
