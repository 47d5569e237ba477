"""The leak rule's maths (:mod:`memagent.alerting.growth`) on plain values."""

from __future__ import annotations

import pytest
from proctree import GiB, KiB, MiB

from memagent.alerting.growth import MIN_SECONDS, Growth, growth, judge


def test_growth_is_fitted_from_the_latest_low() -> None:
    assert growth([], 1.0) is None
    assert growth([5 * MiB, 6 * MiB], 1.0) is None  # fewer than 3 values
    assert growth([5 * MiB, 7 * MiB, 6 * MiB, 1 * MiB], 1.0) is None  # it just fell back
    assert growth([7 * MiB] * 10, 1.0) is None  # flat: the latest low is the last value
    # An old climb, a fall below where it began, then 2 MiB per 0.5 s slot from the latest
    # low: only that is fitted.
    values = [9 * MiB, 50 * MiB, 90 * MiB, 3 * MiB, 3 * MiB, 5 * MiB, 7 * MiB, 9 * MiB]
    g = growth(values, 0.5)
    assert g is not None
    assert (g.rate, g.seconds, g.fit) == (pytest.approx(4 * MiB), 1.5, pytest.approx(1.0))
    # A fall that stays above an earlier low does not restart it (noise dips do not
    # either): the climb and the fall are in the fit, which is then poor.
    g = growth([1 * MiB, 50 * MiB, 90 * MiB, 3 * MiB, 5 * MiB, 7 * MiB, 9 * MiB], 1.0)
    assert g is not None and g.seconds == 6.0 and g.fit < 0.9


def test_growth_is_exact_at_any_size_and_judges_the_fit() -> None:
    big = 4096 * GiB - 64 * MiB
    g = growth([big + i * 4 * KiB for i in range(300)], 1.0)
    assert g is not None and g.rate == pytest.approx(4 * KiB) and g.fit == pytest.approx(1.0)
    # Climbing overall but in a zigzag as tall as the climb: a poor fit.
    zigzag = [0, 10, 2, 12, 4, 14, 6, 16]
    g = growth([MiB * v for v in zigzag], 1.0)
    assert g is not None and g.rate > 0 and g.fit < 0.9


def test_judge_waits_one_percent_of_the_time_left() -> None:
    fast = Growth(rate=20 * MiB, seconds=20.0, fit=0.99)
    v = judge(fast, 24 * GiB, 1 * MiB, 86400, 299)
    assert v.leaking and v.eta == pytest.approx(1228.8) and v.needed == MIN_SECONDS
    assert v.per_minute == 20 * MiB * 60
    slow = Growth(rate=1 * MiB, seconds=240.0, fit=0.99)
    assert judge(slow, 24 * GiB, 1 * MiB, 86400, 299).needed == pytest.approx(245.76)
    assert not judge(slow, 24 * GiB, 1 * MiB, 86400, 299).leaking  # 240 s < 1% of 6.8 h
    assert judge(Growth(1 * MiB, 246.0, 0.99), 24 * GiB, 1 * MiB, 86400, 299).leaking
    assert not judge(Growth(1 * MiB, 246.0, 0.99), 24 * GiB, 1 * MiB, 3600, 299).leaking  # beyond the horizon
    assert not judge(Growth(1 * MiB, 246.0, 0.85), 24 * GiB, 1 * MiB, 86400, 299).leaking  # poor fit
    assert not judge(Growth(MiB // 120, 299.0, 1.0), 0, 1 * MiB, 86400, 299).leaking  # under leak_min_rate
    # A short leak_window caps what is waited for, the 20 s floor included.
    assert judge(Growth(20 * MiB, 5.0, 0.99), 24 * GiB, 1 * MiB, 86400, 5).leaking
    # Slow growth waits for the whole window (or the history kept), no more.
    assert judge(Growth(MiB / 60, 299.0, 0.99), 1 * GiB, 1 * MiB, 86400, 299).needed == 299
    assert judge(None, 24 * GiB, 1 * MiB, 86400, 299).eta is None
    assert judge(Growth(-1 * MiB, 30.0, 0.0), 24 * GiB, 1 * MiB, 86400, 299).per_minute == 0.0
