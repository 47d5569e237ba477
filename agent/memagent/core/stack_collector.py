"""Schedules py-spy dumps under one budget and keeps each process's stacks.

The tick only *asks* (:meth:`StackCollector.on_tick` queues requests, O(1) each); dumps
run as asyncio subprocesses in :meth:`StackCollector.run`, at most ``concurrency`` at a
time and at most ``budget`` per second, highest priority first (on demand, new peak,
growth, rotation). A slow or failing py-spy therefore never delays a memory tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Callable, Collection

from memproto.records import StackDump
from memproto.vocabulary import StackState, StackTrigger

from ..config import StackConfig
from ..errors import MemagentError
from ..proc import pyspy
from ..proc.pyspy import ADVICE, find_py_spy
from .process_stacks import (
    DEMAND,
    GROWTH,
    PEAK,
    ROTATION,
    TRIGGER_NAMES,
    ProcessStacks,
    TokenBucket,
    with_attribution,
)
from .registry import Registry
from .watched import Watched

log = logging.getLogger(__name__)

Key = tuple[int, int]


class StackCollector:
    def __init__(self, config: StackConfig, on_state: Callable[[Watched, str | None], None] | None = None) -> None:
        self.config = config
        self.py_spy = find_py_spy(config.py_spy) if config.enabled else None
        self.on_state = on_state or (lambda w, message: None)
        #: Told of each new stack at a process's peak (the flight recorder keeps them).
        self.on_peak_stack: Callable[[Watched, StackDump], None] = lambda w, dump: None
        self.bucket = TokenBucket(config.budget, config.burst)
        self.stacks: dict[Key, ProcessStacks] = {}
        self.dumps_started = 0
        self._watched: dict[Key, Watched] = {}
        self._heap: list[tuple[int, int, Key]] = []
        self._queued: dict[Key, int] = {}
        self._seq = itertools.count()
        self._waiters: dict[Key, list[asyncio.Future[None]]] = {}
        self._wakeup: asyncio.Event | None = None
        self._sem: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._peaks: dict[Key, int] = {}
        self._next_rotation = 0.0
        if config.enabled and self.py_spy is None:
            log.warning("py-spy not found: no Python stacks (%s)", ADVICE[StackState.MISSING])

    @property
    def usable(self) -> bool:
        return self.config.enabled and self.py_spy is not None

    def of(self, w: Watched) -> ProcessStacks:
        ps = self.stacks.get(w.key)
        if ps is None:
            ps = self.stacks[w.key] = ProcessStacks()
            self._watched[w.key] = w
        return ps

    def _set_state(self, w: Watched, state: str, message: str | None) -> None:
        ps = self.of(w)
        if (ps.state, ps.message) != (state, message):
            ps.state, ps.message = state, message
            w.stack_state = state
            self.on_state(w, message)

    # ------------------------------------------------------------------ from the tick

    def on_tick(self, now: float, changed: list[Watched], exited: list[Watched], registry: Registry) -> None:
        """``changed``: the processes whose memory was re-read this tick (the others did not
        move, so they cannot have grown)."""
        for w in exited:
            if w.key in self.stacks:
                self._set_state(w, StackState.EXITED, ADVICE[StackState.EXITED])
        threshold = self.config.growth_threshold
        for w in changed:
            if not w.alive:
                continue
            ps = self.of(w)
            total = w.rss + (w.vram or 0)
            peak = w.peak + (w.vram_peak or 0)
            prev = ps.prev_total
            ps.prev_total = total
            if prev is None:
                self._peaks[w.key] = peak
                continue
            delta = total - prev
            if delta > 0:
                ps.pending_growth += delta
            if ps.state in StackState.FINAL:
                continue
            if peak > self._peaks.get(w.key, 0) and delta > 0:
                self.request(w, PEAK)
            elif delta >= threshold:
                self.request(w, GROWTH)
            self._peaks[w.key] = max(peak, self._peaks.get(w.key, 0))
        if now >= self._next_rotation:
            self._next_rotation = now + 1.0
            self._rotate(now, registry.alive, registry.entries.keys())

    def _rotate(self, now: float, alive: list[Watched], entries: Collection[Key]) -> None:
        """Once a second: forget detached processes; queue the stalest Python process."""
        for key in [k for k in self.stacks if k not in entries]:
            del self.stacks[key]
            self._watched.pop(key, None)
            self._peaks.pop(key, None)
        stale = [w for w in alive if self.of(w).state not in StackState.FINAL
                 and now - self.of(w).last_taken >= self.config.rotation
                 and now - self.of(w).last_request >= self.config.rotation]
        if stale:
            self.request(min(stale, key=lambda w: self.of(w).last_taken), ROTATION)

    # ------------------------------------------------------------------ queue

    def request(self, w: Watched, priority: int) -> None:
        ps = self.of(w)
        if not self.usable:
            self._set_state(w, StackState.DISABLED if not self.config.enabled else StackState.MISSING,
                            None if not self.config.enabled else ADVICE[StackState.MISSING])
            return
        queued = self._queued.get(w.key)
        if queued is not None and queued <= priority:
            return
        self._queued[w.key] = priority
        ps.last_request = time.time()
        heapq.heappush(self._heap, (priority, next(self._seq), w.key))
        if ps.state is None:
            self._set_state(w, StackState.PENDING, None)
        if self._wakeup is not None:
            self._wakeup.set()

    async def demand(self, w: Watched, timeout: float = 15.0) -> None:
        """Take a fresh dump of ``w`` (ahead of the queue, within the budget) and wait for it."""
        if not self.usable:
            self.request(w, DEMAND)  # sets the state that says why not
            return
        if self.of(w).state in StackState.FINAL:
            return  # not Python, or gone: a dump would only spend budget
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(w.key, []).append(future)
        self.request(w, DEMAND)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(future), timeout)

    # ------------------------------------------------------------------ dumping

    async def run(self) -> None:
        self._wakeup = asyncio.Event()
        self._sem = asyncio.Semaphore(self.config.concurrency)
        try:
            while True:
                if not self._heap:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                await self._sem.acquire()
                wait = self.bucket.take()
                while wait > 0:
                    await asyncio.sleep(wait)
                    wait = self.bucket.take()
                if not self._heap:  # drained meanwhile (detached)
                    self._sem.release()
                    continue
                priority, _, key = heapq.heappop(self._heap)
                if self._queued.get(key) != priority:
                    self._sem.release()
                    continue  # superseded by a higher-priority request
                del self._queued[key]
                task = asyncio.ensure_future(self._dump(key, priority))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            # Wait for them (each reaps its py-spy): nothing of ours outlives the loop.
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _dump(self, key: Key, priority: int) -> None:
        assert self._sem is not None
        try:
            w = self._watched.get(key)
            if w is None or not w.alive:
                if w is not None:
                    self._set_state(w, StackState.EXITED, ADVICE[StackState.EXITED])
                return
            self.dumps_started += 1
            await self._run_py_spy(w, TRIGGER_NAMES[priority])
        finally:
            self._sem.release()
            for future in self._waiters.pop(key, []):
                if not future.done():
                    future.set_result(None)

    async def _run_py_spy(self, w: Watched, trigger: str) -> None:
        assert self.py_spy is not None
        if trigger != StackTrigger.DEMAND and not self._looks_like_python(w):
            self._set_state(w, StackState.NOT_PYTHON, ADVICE[StackState.NOT_PYTHON])
            return
        result = await pyspy.dump(self.py_spy, w.pid, self.config.timeout, time.time, trigger, w.rss, w.vram,
                                  lambda: w.alive and w.handle.alive())
        if result.dump is None:
            self._set_state(w, result.state, result.message)
            return
        ps, dump = self.of(w), with_attribution(result.dump)
        ps.record(dump)
        if ps.at_peak is dump:
            self.on_peak_stack(w, dump)
        self._set_state(w, StackState.OK, None)

    @staticmethod
    def _looks_like_python(w: Watched) -> bool:
        """No interpreter in its maps: no py-spy run for the automatic triggers (see
        :func:`memagent.proc.pyspy.maps_show_python`); unreadable: let py-spy say why."""
        try:
            return pyspy.maps_show_python(w.handle.maps())
        except MemagentError:
            return True

    def peak_text(self, w: Watched) -> str | None:
        """The stack closest to ``w``'s peak, as text (for an oom-kill alert)."""
        ps = self.stacks.get(w.key)
        return ps.peak_text() if ps else None
