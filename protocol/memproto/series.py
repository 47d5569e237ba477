"""Bounded, peak-preserving memory history: the data structure behind the ``Series``
of a ``history_ok`` frame, kept by the agent for every watched process and by clients
that chart it.

Each slot covers ``step`` seconds of wall time and keeps the *maximum* value added in it,
so downsampling never hides a peak. Values are stored in KiB in an ``array('I')`` (up to
4 TiB): 4 bytes a slot, 600 slots (10 minutes at 1 s) = 2.4 KB per process.
"""

from __future__ import annotations

from array import array

KIB = 1024


class PeakSeries:
    __slots__ = ("_buf", "_count", "_last_slot", "step")

    def __init__(self, step: float, slots: int) -> None:
        if step <= 0 or slots <= 0:
            raise ValueError("step and slots must be positive")
        self.step = step
        self._buf = array("I", bytes(4 * slots))
        self._last_slot = -1
        self._count = 0

    def add(self, now: float, rss_bytes: int) -> None:
        kib = min(rss_bytes // KIB, 0xFFFFFFFF)
        slot = int(now // self.step)
        buf = self._buf
        size = len(buf)
        last = self._last_slot
        if slot == last:
            i = slot % size
            if kib > buf[i]:
                buf[i] = kib
            return
        if slot < last:  # the clock went back: keep the history monotonic
            return
        # Slots skipped (an overrun, or interval > step) take the new value.
        gap = size if last < 0 else min(slot - last, size)
        for s in range(slot - gap + 1, slot + 1):
            buf[s % size] = kib
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
        values = [self._buf[s % size] * KIB for s in range(first, self._last_slot + 1)]
        return (self._last_slot + 1) * self.step, values

    def load(self, end_time: float, values: list[int]) -> None:
        """Fill from a received series (oldest first, the last slot ending at ``end_time``);
        values added later merge with it as usual."""
        first_end = end_time - self.step * (len(values) - 1)
        for i, value in enumerate(values):
            self.add(first_end + self.step * i - self.step / 2, value)

    def points(self, seconds: float | None = None) -> list[tuple[float, int]]:
        """``(slot end time, bytes)`` oldest first, for charts."""
        end, values = self.series(seconds)
        first_end = end - self.step * (len(values) - 1)
        return [(first_end + self.step * i, v) for i, v in enumerate(values)]

    @property
    def last_slot(self) -> int:
        """The slot (``int(time // step)``) of the newest value; -1 when empty."""
        return self._last_slot

    def __len__(self) -> int:
        return self._count
