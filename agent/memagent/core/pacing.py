"""Requests never hold up the tick: their work is cut into slices.

A request that touches many processes (an attach of 1000 PIDs, a list or history of
1000 processes) would hold the event loop for 30-200 ms in one piece. Handlers instead
call :meth:`Pacer.pause` between units of work (one PID, one process's record), which
returns at once while the slice is short and the tick is not near; otherwise it yields:
to the tick itself when it is due within :data:`SLICE` (waiting until it has run), else
to the other tasks of the loop. A slice therefore never starts when it could overlap
the tick's deadline, and the tick is late by at most one unit of work.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from .sampler import Ticker

#: Longest run of request work between two yields, in seconds.
SLICE: Final = 0.005


class Pacer:
    def __init__(self, ticker: Ticker | None = None, slice_seconds: float = SLICE) -> None:
        self.ticker = ticker
        self.slice = slice_seconds
        #: Times a request gave way (to the tick, or to others); for tests and status.
        self.yields = 0

    def start(self) -> Slice:
        """A slice clock for one request's work."""
        return Slice(self)


class Slice:
    __slots__ = ("_pacer", "_start")

    def __init__(self, pacer: Pacer) -> None:
        self._pacer = pacer
        self._start = time.perf_counter()

    async def pause(self) -> None:
        """Between two units of work: go on, or give the loop (and the tick) its turn."""
        pacer = self._pacer
        ticker = pacer.ticker
        tick_near = ticker is not None and ticker.due_in() <= pacer.slice
        if not tick_near and time.perf_counter() - self._start < pacer.slice:
            return
        pacer.yields += 1
        if tick_near and ticker is not None:
            await ticker.next_tick()
        else:
            await asyncio.sleep(0)
        self._start = time.perf_counter()
