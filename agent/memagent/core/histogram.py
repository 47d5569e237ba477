"""Cumulative bucket counts of a duration, as a Prometheus histogram keeps them: the
tick's duration (``memagent_tick_duration_seconds``, docs/metrics.md) is observed on
every tick, so observing is one bisect and two additions, and nothing is allocated."""

from __future__ import annotations

from bisect import bisect_left

#: Upper bounds (seconds) of the tick-duration buckets; +Inf is implied.
TICK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    """Counts per bucket (``counts[i]``: observations <= ``bounds[i]`` and above the bound
    before; the last: above every bound), their number and their sum."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...] = TICK_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def cumulative(self) -> tuple[int, ...]:
        """Observations <= each bound, then all of them (the ``+Inf`` bucket)."""
        out, running = [], 0
        for n in self.counts:
            running += n
            out.append(running)
        return tuple(out)
