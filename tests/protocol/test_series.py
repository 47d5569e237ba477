"""The peak-preserving history (:class:`memproto.series.PeakSeries`) that the sampler
feeds and clients chart."""

from __future__ import annotations

import pytest

from memagent.proc.procfs import PAGE_SIZE
from memproto.series import PeakSeries as PeakHistory

# --------------------------------------------------------------------------- PeakHistory

P = PAGE_SIZE


def test_history_starts_empty() -> None:
    """Before any sample there is no series and no end time."""
    history = PeakHistory(step=1.0, slots=10)
    assert history.series() == (0.0, [])
    assert len(history) == 0


@pytest.mark.parametrize(("step", "slots"), [(0, 10), (-1.0, 10), (1.0, 0), (1.0, -5)])
def test_history_refuses_bad_geometry(step: float, slots: int) -> None:
    """A zero step or capacity is a configuration error."""
    with pytest.raises(ValueError):
        PeakHistory(step=step, slots=slots)


def test_history_keeps_the_max_within_a_slot() -> None:
    """Downsampling must never hide a peak: a slot keeps its largest sample."""
    history = PeakHistory(step=1.0, slots=10)
    for now, pages in [(100.1, 5), (100.4, 9), (100.9, 3)]:
        history.add(now, pages * P)
    assert history.series() == (101.0, [9 * P])
    assert len(history) == 1


def test_history_rounds_to_kib() -> None:
    """Values are stored in KiB: a partial KiB is dropped (RSS is whole pages anyway)."""
    history = PeakHistory(step=1.0, slots=4)
    history.add(0.0, 3 * P + 1536)
    assert history.series()[1] == [3 * P + 1024]


def test_history_fills_gaps_with_the_new_value() -> None:
    """Slots skipped by a late tick take the value sampled after them."""
    history = PeakHistory(step=1.0, slots=10)
    history.add(100.0, 2 * P)
    history.add(103.5, 7 * P)
    assert history.series() == (104.0, [2 * P, 7 * P, 7 * P, 7 * P])
    assert len(history) == 4


def test_history_series_seconds_bounds_the_window() -> None:
    """series(seconds) returns the most recent slots covering at least that long."""
    history = PeakHistory(step=1.0, slots=10)
    for t in range(6):
        history.add(float(t), (t + 1) * P)
    assert history.series(2) == (6.0, [5 * P, 6 * P])
    assert history.series(2.5) == (6.0, [4 * P, 5 * P, 6 * P])
    assert history.series(0) == (6.0, [6 * P])
    assert history.series(1000) == (6.0, [(t + 1) * P for t in range(6)])
    assert history.series(None) == history.series(1000)


def test_history_series_seconds_with_fractional_step() -> None:
    """The window is counted in slots of ``step`` seconds."""
    history = PeakHistory(step=0.5, slots=20)
    for i in range(10):
        history.add(i * 0.5, (i + 1) * P)
    end, values = history.series(2.0)
    assert end == 5.0
    assert values == [7 * P, 8 * P, 9 * P, 10 * P]


def test_history_wraps_around_at_capacity() -> None:
    """Past its capacity the buffer keeps only the newest slots, oldest first."""
    history = PeakHistory(step=1.0, slots=4)
    for t in range(10):
        history.add(float(t), t * P)
    assert history.series() == (10.0, [6 * P, 7 * P, 8 * P, 9 * P])
    assert len(history) == 4


def test_history_gap_longer_than_capacity() -> None:
    """A gap longer than the whole buffer replaces all of it."""
    history = PeakHistory(step=1.0, slots=4)
    history.add(0.0, 1 * P)
    history.add(1.0, 2 * P)
    history.add(100.0, 5 * P)
    assert history.series() == (101.0, [5 * P] * 4)
    assert len(history) == 4


def test_history_ignores_a_clock_going_backwards() -> None:
    """A sample from an earlier slot is dropped: the history stays monotonic."""
    history = PeakHistory(step=1.0, slots=10)
    history.add(10.0, 5 * P)
    history.add(11.0, 6 * P)
    history.add(5.0, 100 * P)
    assert history.series() == (12.0, [5 * P, 6 * P])
    history.add(11.5, 8 * P)  # same slot as the last one: still counts
    assert history.series() == (12.0, [5 * P, 8 * P])


def test_history_load_and_points_round_trip() -> None:
    """A client loads a received series and charts it: same values, slot end times."""
    source = PeakHistory(step=1.0, slots=10)
    for t, v in [(100.2, 5 * P), (101.5, 7 * P), (101.9, 9 * P), (103.0, 4 * P)]:
        source.add(t, v)
    end, values = source.series()
    copy = PeakHistory(step=1.0, slots=10)
    copy.load(end, values)
    assert copy.series() == (end, values)
    assert copy.points() == [(101.0, 5 * P), (102.0, 9 * P), (103.0, 4 * P), (104.0, 4 * P)]


def test_history_end_time_is_the_end_of_the_last_slot() -> None:
    """end_time is when the last slot ends, on the step grid, not the sample's time."""
    history = PeakHistory(step=0.5, slots=10)
    history.add(10.2, P)
    assert history.series()[0] == 10.5
    history.add(10.74, P)
    assert history.series()[0] == 11.0
    hourly = PeakHistory(step=60.0, slots=60)
    hourly.add(1_700_000_012.0, P)
    assert hourly.series()[0] == (1_700_000_012.0 // 60 + 1) * 60


def test_history_clamps_huge_values() -> None:
    """A value beyond 2**32 KiB saturates instead of raising OverflowError in the sampler."""
    history = PeakHistory(step=1.0, slots=2)
    history.add(0.0, 2**33 * 1024)
    assert history.series()[1] == [0xFFFFFFFF * 1024]
