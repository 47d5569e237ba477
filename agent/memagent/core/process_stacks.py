"""What the stacks of one process tell: the latest, the one at the peak, and where its
memory grew; and the budget all dumps share.

**Attribution**: every positive RSS/VRAM delta between ticks waits in the process's
pending growth; the next stack taken gets it, credited to the innermost frame of the
attributed thread and aggregated by line and by function (the lines of one function
together). This is correlation from sampling: see ``docs/stacks.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from memproto.records import GrowthSite, StackDump, ThreadStack
from memproto.vocabulary import StackTrigger

MiB = 1024 * 1024

#: Priorities: lower runs first.
DEMAND, PEAK, GROWTH, ROTATION = 0, 1, 2, 3
TRIGGER_NAMES = {DEMAND: StackTrigger.DEMAND, PEAK: StackTrigger.PEAK, GROWTH: StackTrigger.GROWTH,
                 ROTATION: StackTrigger.ROTATION}
MAX_SITES = 200


def attributed_thread(threads: list[ThreadStack]) -> ThreadStack | None:
    """The thread growth is attributed to: the active one holding the GIL, else any active
    one, else the main thread, else the first."""
    with_frames = [t for t in threads if t.frames]
    picks: list[Callable[[ThreadStack], bool]] = [
        lambda t: t.active and t.owns_gil,
        lambda t: t.active,
        lambda t: t.name == "MainThread",
    ]
    for pick in picks:
        for t in with_frames:
            if pick(t):
                return t
    return with_frames[0] if with_frames else None


def with_attribution(dump: StackDump) -> StackDump:
    """``dump`` naming the thread its growth is credited to (:func:`attributed_thread`)."""
    chosen = attributed_thread(dump.threads)
    return replace(dump, attributed_thread=chosen.thread_id if chosen else None)


class ProcessStacks:
    """Stacks and attribution of one watched process."""

    __slots__ = ("at_peak", "at_peak_rss", "by_function", "by_line", "last_request", "last_taken", "latest",
                 "message", "pending_growth", "prev_total", "state")

    def __init__(self) -> None:
        self.state: str | None = None
        self.message: str | None = None
        self.latest: StackDump | None = None
        self.at_peak: StackDump | None = None
        self.at_peak_rss = -1
        self.pending_growth = 0
        self.prev_total: int | None = None
        self.by_line: dict[tuple[str, str, int], list[int]] = {}
        self.by_function: dict[tuple[str, str], list[int]] = {}
        self.last_taken = 0.0
        self.last_request = 0.0

    def record(self, dump: StackDump) -> None:
        """A new dump: the latest; the stack at peak if taken at the highest RSS so far; and
        the growth pending since the previous dump is attributed to it."""
        self.latest = dump
        self.last_taken = dump.time
        # Replaced only by a dump at clearly more memory (1%, at least 1 MiB): at a plateau
        # the first stack taken there is the one closest to reaching it.
        total = dump.rss_bytes + (dump.vram_bytes or 0)
        if self.at_peak is None or total > self.at_peak_rss + max(MiB, self.at_peak_rss // 100):
            self.at_peak = dump
            self.at_peak_rss = total
        growth, self.pending_growth = self.pending_growth, 0
        thread = dump.attributed()
        if growth <= 0 or thread is None or not thread.frames:
            return
        # Attributed to the innermost frame only: counting every frame on the stack would
        # put <module> and main() on top of every table, since they are on every stack.
        leaf = thread.frames[0]
        _bump(self.by_line, (leaf.name, leaf.filename, leaf.line), growth)
        _bump(self.by_function, (leaf.name, leaf.filename), growth)

    def peak_text(self) -> str | None:
        """The stack closest to the peak, as one line of text (for an oom-kill alert)."""
        dump = self.at_peak or self.latest
        if dump is None:
            return None
        thread = dump.attributed()
        frames = thread.frames if thread else []
        return "stack at peak: " + " <- ".join(f"{f.name} ({f.filename}:{f.line})" for f in frames[:8])

    def sites(self, limit: int = 20) -> tuple[list[GrowthSite], list[GrowthSite]]:
        lines = sorted(self.by_line.items(), key=lambda kv: -kv[1][0])[:limit]
        funcs = sorted(self.by_function.items(), key=lambda kv: -kv[1][0])[:limit]
        return (
            [GrowthSite(n, f, ln, b, c) for (n, f, ln), (b, c) in lines],
            [GrowthSite(n, f, None, b, c) for (n, f), (b, c) in funcs],
        )


def _bump(table: dict[Any, list[int]], key: Any, growth: int) -> None:
    entry = table.get(key)
    if entry is None:
        if len(table) >= MAX_SITES:  # bounded: forget the smallest site
            del table[min(table, key=lambda k: table[k][0])]
        table[key] = [growth, 1]
    else:
        entry[0] += growth
        entry[1] += 1


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self.clock = clock
        self.tokens = float(self.burst)
        self.stamp = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self) -> float:
        """Take a token; returns 0, or the seconds to wait before one is there (none taken)."""
        self._refill()
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate
