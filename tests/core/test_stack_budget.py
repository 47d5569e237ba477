"""The CPU budget of the stack work (memagent.core.stack_budget): a sliding window of
charged CPU seconds on the monotonic clock, judged as the window's spend over its length."""

from __future__ import annotations

import pytest

from memagent.core.stack_budget import CpuBudget


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_spend_is_what_was_charged_in_the_window_and_slides_out() -> None:
    clock = Clock()
    budget = CpuBudget(0.05, window=10.0, clock=clock)
    budget.charge(0.1, 0.2)  # at 1000
    clock.now += 4
    budget.charge(0.0, 0.1)  # at 1004
    assert budget.spent() == pytest.approx(0.4)
    assert budget.rate == pytest.approx(0.04)
    assert not budget.exhausted and budget.room() == pytest.approx(0.1)
    clock.now = 1010.5  # a second counts while any part of it is in the window
    assert budget.spent() == pytest.approx(0.4)
    clock.now = 1011.0  # the second of 1000 has left the window, 1004's has not
    assert budget.spent() == pytest.approx(0.1)
    clock.now = 1015.0
    assert budget.spent() == 0.0 and budget.rate == 0.0
    # Since the start, whatever the window: the daemon's own and its helpers', apart.
    assert (budget.own_seconds, budget.helper_seconds) == (pytest.approx(0.1), pytest.approx(0.3))


def test_at_the_budget_it_is_exhausted_until_the_spend_slides_out() -> None:
    clock = Clock()
    budget = CpuBudget(0.05, window=10.0, clock=clock)
    for _ in range(5):  # 0.5 s of CPU in five seconds: 5 % of a core over the 10 s window
        budget.charge(0.05, 0.05)
        clock.now += 1
    assert budget.exhausted and budget.rate == pytest.approx(0.05)
    assert budget.room() == pytest.approx(0.0)
    clock.now += 6  # the first second's 0.1 s is out
    assert not budget.exhausted and budget.rate == pytest.approx(0.04)
    budget.share = 0.03  # a reload lowers it: judged at once
    assert budget.exhausted and budget.room() == pytest.approx(-0.1)


def test_a_short_start_is_judged_over_the_whole_window() -> None:
    """0.3 s in the first second is 3 % of a core over 10 s, not 30 %: the budget allows
    its window's worth of CPU however it is spread in the window."""
    clock = Clock()
    budget = CpuBudget(0.05, window=10.0, clock=clock)
    budget.charge(0.0, 0.3)
    assert budget.rate == pytest.approx(0.03) and not budget.exhausted


def test_nothing_or_negatives_charge_nothing() -> None:
    clock = Clock()
    budget = CpuBudget(0.05, clock=clock)
    budget.charge(0.0, 0.0)
    budget.charge(-1.0, 0.0)
    assert budget.spent() == 0.0 and budget.own_seconds == 0.0
