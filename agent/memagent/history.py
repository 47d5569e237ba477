"""Bounded, peak-preserving RSS history per process.

Each slot covers ``step`` seconds of wall time and keeps the *maximum* RSS sampled in it,
so downsampling never hides a peak. Values are stored as pages in an ``array('I')``: 4
bytes a slot, 600 slots (10 minutes at 1 s) = 2.4 KB per process, 2.4 MB for 1000.
"""

from __future__ import annotations

from array import array

from .procfs import PAGE_SIZE


class PeakHistory:
    __slots__ = ("_buf", "_count", "_last_slot", "step")

    def __init__(self, step: float, slots: int) -> None:
        if step <= 0 or slots <= 0:
            raise ValueError("step and slots must be positive")
        self.step = step
        self._buf = array("I", bytes(4 * slots))
        self._last_slot = -1
        self._count = 0

    def add(self, now: float, rss_bytes: int) -> None:
        pages = min(rss_bytes // PAGE_SIZE, 0xFFFFFFFF)
        slot = int(now // self.step)
        buf = self._buf
        size = len(buf)
        last = self._last_slot
        if slot == last:
            i = slot % size
            if pages > buf[i]:
                buf[i] = pages
            return
        if slot < last:  # the clock went back: keep the history monotonic
            return
        # Slots skipped (an overrun, or interval > step) take the new value.
        gap = size if last < 0 else min(slot - last, size)
        for s in range(slot - gap + 1, slot + 1):
            buf[s % size] = pages
        self._count = min(size, self._count + (1 if last < 0 else gap))
        self._last_slot = slot

    def series(self, seconds: float | None = None) -> tuple[float, list[int]]:
        """``(end_time, bytes oldest first)``; ``end_time`` is when the last slot ends."""
        if self._last_slot < 0:
            return 0.0, []
        n = self._count
        if seconds is not None:
            n = min(n, max(1, int(seconds / self.step + 0.999999)))
        size = len(self._buf)
        first = self._last_slot - n + 1
        values = [self._buf[s % size] * PAGE_SIZE for s in range(first, self._last_slot + 1)]
        return (self._last_slot + 1) * self.step, values

    def __len__(self) -> int:
        return self._count
