"""The CPU budget of reading stacks: the daemon's own stack work and its helpers' (py-spy,
Austin) together, held to ``[stacks] cpu_budget`` of one core over a sliding window.

What is charged (:meth:`CpuBudget.charge`), all of it measured, none of it estimated:

* the daemon's own thread time spent on stacks: the stack part of each tick
  (:meth:`memagent.core.stack_collector.StackCollector.on_tick`), starting each helper (the
  fork), reading Austin's lines and crediting its rounds, reading py-spy's JSON;
* each helper's CPU: its ``rusage`` when the daemon reaps it (exact, whatever its length),
  and for a running Austin its ``/proc/PID/stat`` once a second, so that a burst can be
  stopped before it ends (:mod:`memagent.proc.helper`).

The spend is kept per second of the monotonic clock over the last ``WINDOW_S`` seconds (a
second counts while any part of it is in the window: the spend is never under-read); its
rate is the spend over the whole window divided by the window (a short start is not
judged as if it lasted). While the rate is at or over the budget no burst starts and no
automatic dump is taken (a ``stack`` request still is: someone asked), and the bursts that
spent the most are stopped (:meth:`memagent.core.bursts.Bursts.police`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

#: The window the budget is judged over, in seconds.
WINDOW_S = 10.0


class CpuBudget:
    """CPU seconds spent on stacks, in total and over the last ``window`` seconds."""

    def __init__(self, share: float, window: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        #: The share of one core the stack work may use ([stacks] cpu_budget).
        self.share = share
        self.window = window
        self.clock = clock
        #: Since the daemon started: its own thread time on stacks, and its helpers'.
        self.own_seconds = 0.0
        self.helper_seconds = 0.0
        #: (second of the clock, CPU seconds charged in it), oldest first.
        self._seconds: deque[list[float]] = deque()

    def charge(self, own: float, helper: float) -> None:
        """``own`` seconds of the daemon's thread time and ``helper`` of a helper's."""
        if own <= 0 and helper <= 0:
            return
        self.own_seconds += max(0.0, own)
        self.helper_seconds += max(0.0, helper)
        second = float(int(self.clock()))
        if self._seconds and self._seconds[-1][0] == second:
            self._seconds[-1][1] += max(0.0, own) + max(0.0, helper)
        else:
            self._seconds.append([second, max(0.0, own) + max(0.0, helper)])

    def spent(self) -> float:
        """CPU seconds charged over the last ``window`` seconds."""
        start = self.clock() - self.window
        while self._seconds and self._seconds[0][0] + 1 <= start:
            self._seconds.popleft()
        return sum(amount for _, amount in self._seconds)

    @property
    def rate(self) -> float:
        """The share of one core spent over the window."""
        return self.spent() / self.window

    @property
    def exhausted(self) -> bool:
        """Whether the window's spend has reached the budget: nothing automatic starts."""
        return self.rate >= self.share

    def room(self) -> float:
        """CPU seconds still allowed in the window (negative: over by that much)."""
        return self.share * self.window - self.spent()
