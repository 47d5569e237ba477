"""Schedules py-spy dumps under one budget, sampler bursts while memory grows, and keeps
each process's stacks.

The tick only *asks* (:meth:`StackCollector.on_tick` queues requests, O(1) each); dumps
run as asyncio subprocesses in :meth:`StackCollector.run`, at most ``concurrency`` at a
time and at most ``budget`` per second, highest priority first (on demand, new peak,
growth, rotation). A slow or failing py-spy therefore never delays a memory tick. All of
the stack work, the daemon's and its helpers', is held to ``[stacks] cpu_budget`` of a
core (:mod:`memagent.core.stack_budget`): while it is spent, only ``stack`` requests are
dumped and no burst starts.

While a process grows (a tick saw it rise by ``SAMPLING_MIN``), a *burst*: Austin
attached for 5 s at 100 Hz (:func:`memagent.proc.austin.sample`), its
rounds credited as they arrive (:meth:`ProcessStacks.record_round`), renewed while the
growth goes on (:mod:`memagent.core.bursts`). ``[stacks] sampler = "dumps"``
takes py-spy dumps back to back instead (10/s: measured to slow an allocating target by
~10 %, kept to compare); ``"off"``: no bursts.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import replace

from memproto.records import StackDump
from memproto.vocabulary import StackState, StackTrigger

from ..config import StackConfig, copy_live
from ..errors import MemagentError
from ..proc import pyspy
from ..proc.austin import find_austin
from ..proc.pyspy import ADVICE, find_py_spy
from .bursts import BURST_INTERVAL_MS, BURST_SECONDS, Bursts
from .process_stacks import (
    DEMAND,
    GROWTH,
    PEAK,
    ROTATION,
    SAMPLING,
    TRIGGER_NAMES,
    ProcessStacks,
    TokenBucket,
)
from .registry import Registry
from .stack_budget import CpuBudget
from .watched import Watched

log = logging.getLogger(__name__)

Key = tuple[int, int]

#: While a process grows, dumps in a row: for SAMPLING_WINDOW s after a tick saw it grow by
#: SAMPLING_MIN or more, one dump after the other, all processes together at most
#: SAMPLING_FACTOR x the stack budget a second (10/s at the default 4), from a bucket of
#: their own, so that they never delay the budget's other dumps. Growth is credited only to
#: stacks read while the RSS rose (``ProcessStacks``): the more dumps during growth, the
#: more of it is credited, and to the code that was running.
SAMPLING_WINDOW = 3.0
SAMPLING_MIN = 1024 * 1024
SAMPLING_FACTOR = 2.5
#: While the CPU budget is spent, how often the queue looks again.
BUDGET_WAIT = 0.25
NO_AUSTIN = "austin not found (pip install 'austin-dist<4', or set [stacks] austin)"


class StackCollector:
    def __init__(self, config: StackConfig, on_state: Callable[[Watched, str | None], None] | None = None,
                 on_peak_stack: Callable[[Watched, StackDump], None] | None = None) -> None:
        self.config = config
        self.py_spy = find_py_spy(config.py_spy) if config.enabled else None
        self.austin = find_austin(config.austin) if config.enabled and config.sampler == "austin" else None
        self.on_state = on_state or (lambda w, message: None)
        #: Told of each new stack at a process's peak (the flight recorder keeps them).
        self.on_peak_stack: Callable[[Watched, StackDump], None] = on_peak_stack or (lambda w, dump: None)
        #: The CPU of all stack work, the daemon's own and its helpers' ([stacks] cpu_budget).
        self.budget = CpuBudget(config.cpu_budget)
        self.bursts = Bursts(self.austin, self.on_peak_stack, self.budget)
        self.bucket = TokenBucket(config.budget, config.burst)
        self.sampling_bucket = TokenBucket(config.budget * SAMPLING_FACTOR, 2)
        self._running: set[Key] = set()
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
        if config.enabled and config.sampler == "austin" and self.austin is None:
            log.warning("%s: growth is attributed from occasional py-spy dumps only", NO_AUSTIN)

    @property
    def sampler(self) -> str:
        """The sampler that bursts use now: "austin", "dumps" or "off" (none found, or none set)."""
        if not self.usable or self.config.sampler == "off":
            return "off"
        return "dumps" if self.config.sampler == "dumps" else ("austin" if self.austin else "off")

    @property
    def usable(self) -> bool:
        return self.config.enabled and self.py_spy is not None

    @property
    def sampler_note(self) -> str | None:
        """Why :attr:`sampler` is what it is, for humans (``status``)."""
        if not self.usable:
            return None  # stack_note says why
        if self.config.sampler == "off":
            return '[stacks] sampler = "off": growth credited from the other dumps only'
        if self.config.sampler == "dumps":
            return "py-spy dumps one after the other while a process grows"
        if self.austin is None:
            return NO_AUSTIN
        b = self.bursts
        return (f"{self.austin}: {1000 // BURST_INTERVAL_MS} Hz for {BURST_SECONDS:g} s while a process grows; "
                f"{b.cut} bursts cut, {b.refused} refused at the CPU budget or full slots")

    def apply(self, config: StackConfig) -> None:
        """A reload: the live keys of ``[stacks]`` (the budget, timeout, growth threshold,
        rotation) into the running config; what was found at start (py-spy, Austin, the
        sampler) stays until a restart."""
        copy_live(self.config, config)
        self.bucket.rate = self.config.budget
        self.sampling_bucket.rate = self.config.budget * SAMPLING_FACTOR
        self.budget.share = self.config.cpu_budget

    def of(self, w: Watched) -> ProcessStacks:
        ps = self.stacks.get(w.key)
        if ps is None:
            ps = self.stacks[w.key] = ProcessStacks()
            self._watched[w.key] = w
            if w.rss:  # its first reading: growth from here on is measured at the next tick that
                ps.on_tick(time.time(), w.rss + (w.vram or 0))  # re-reads it (an idle process is not re-read)
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
        move, so they cannot have grown). Its thread time is charged to the CPU budget."""
        started = time.thread_time()
        try:
            self._on_tick(now, changed, exited, registry)
        finally:
            self.budget.charge(time.thread_time() - started, 0.0)

    def _on_tick(self, now: float, changed: list[Watched], exited: list[Watched], registry: Registry) -> None:
        for w in exited:
            self.bursts.stop(w.key)
            if w.key in self.stacks:
                self._set_state(w, StackState.EXITED, ADVICE[StackState.EXITED])
        threshold = self.config.growth_threshold
        for w in changed:
            if not w.alive:
                continue
            ps = self.of(w)
            total = w.rss + (w.vram or 0)
            peak = w.peak + (w.vram_peak or 0)
            kept = ps.at_peak
            delta = ps.on_tick(now, total)
            if ps.at_peak is not None and ps.at_peak is not kept:  # a rise's stack became the peak's
                self.on_peak_stack(w, ps.at_peak)
            if delta is None:
                self._peaks[w.key] = peak
                continue
            if ps.state in StackState.FINAL:
                continue
            if self.bursts.running(w.key):
                pass  # the sampler has its stacks, a hundred a second
            elif peak > self._peaks.get(w.key, 0) and delta > 0:
                self.request(w, PEAK)
            elif delta >= threshold:
                self.request(w, GROWTH)
            if delta >= SAMPLING_MIN:
                self._sample(w, ps)
            self._peaks[w.key] = max(peak, self._peaks.get(w.key, 0))
        self.bursts.police()
        if now >= self._next_rotation:
            self._next_rotation = now + 1.0
            self._rotate(now, registry.alive, registry.entries.keys())

    def _rotate(self, now: float, alive: list[Watched], entries: Collection[Key]) -> None:
        """Once a second: forget detached processes; queue the stalest Python process."""
        for key in [k for k in self.stacks if k not in entries]:
            self.bursts.forget(key)
            del self.stacks[key]
            self._watched.pop(key, None)
            self._peaks.pop(key, None)
        stale = [w for w in alive if self.of(w).state not in StackState.FINAL
                 and now - self.of(w).last_taken >= self.config.rotation
                 and now - self.of(w).last_request >= self.config.rotation]
        if stale:
            self.request(min(stale, key=lambda w: self.of(w).last_taken), ROTATION)

    # ------------------------------------------------------------------ bursts

    def _sample(self, w: Watched, ps: ProcessStacks) -> None:
        """``w`` grew: sample it for a while (a burst, or dumps in a row), if the sampler may."""
        sampler = self.sampler
        if sampler == "dumps":
            ps.sampling_until = time.time() + SAMPLING_WINDOW
            if w.key not in self._running:
                self.request(w, SAMPLING)
            return
        if sampler != "austin" or not self._runs_python(w, ps):
            return  # no Austin on a C program of the watched tree (it found nothing, 4 runs a second)
        ps.sampling_until = time.time() + BURST_SECONDS
        self.bursts.start(w, ps)

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
                bucket = self.sampling_bucket if self._heap[0][0] == SAMPLING else self.bucket
                wait = bucket.take()
                while wait > 0:
                    await asyncio.sleep(wait)
                    wait = bucket.take()
                while self.budget.exhausted and self._heap and self._heap[0][0] != DEMAND:
                    await asyncio.sleep(BUDGET_WAIT)  # the CPU budget is spent: only a `stack` request
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
            tasks += self.bursts.take_all()  # cancelled there, once
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
            self._running.add(key)
            try:
                await self._run_py_spy(w, TRIGGER_NAMES[priority])
            finally:
                self._running.discard(key)
            ps = self.of(w)
            if (self.config.sampler == "dumps" and w.alive and ps.state == StackState.OK
                    and time.time() < ps.sampling_until):
                self.request(w, SAMPLING)
        finally:
            self._sem.release()
            for future in self._waiters.pop(key, []):
                if not future.done():
                    future.set_result(None)

    async def _run_py_spy(self, w: Watched, trigger: str) -> None:
        assert self.py_spy is not None
        if trigger != StackTrigger.DEMAND and not self._runs_python(w, self.of(w)):
            self._set_state(w, StackState.NOT_PYTHON, ADVICE[StackState.NOT_PYTHON])
            return
        ps = self.of(w)
        before = _reading(w, ps)
        result = await pyspy.dump(self.py_spy, w.pid, self.config.timeout, time.time, trigger, w.rss, w.vram,
                                  lambda: w.alive and w.handle.alive(), self.budget.charge)
        after = _reading(w, ps)
        if result.dump is None:
            self._set_state(w, result.state, result.message)
            return
        dump, ran = result.dump, None
        if before is not None and after is not None:
            dump = replace(dump, rss_bytes=after[0], rss_rise=after[0] - before[0])
            ran = {tid: ns - before[1].get(tid, 0) for tid, ns in after[1].items()}
        dump = ps.record(dump, ran)
        if ps.at_peak is dump:
            self.on_peak_stack(w, dump)
        self._set_state(w, StackState.OK, None)

    @staticmethod
    def _runs_python(w: Watched, ps: ProcessStacks) -> bool:
        """Whether ``w`` maps a Python interpreter: no py-spy dump for the automatic
        triggers and no Austin burst where it does not (see
        :func:`memagent.proc.pyspy.maps_show_python`); unreadable: let the helper say why.
        Read once per program the process runs: again after an exec (its name or command
        line changes), not at every dump (a large process's maps are long)."""
        program = (w.name, tuple(w.cmdline))
        if ps.python is None or ps.python[0] != program:
            try:
                found = pyspy.maps_show_python(w.handle.maps())
            except MemagentError:
                return True  # not cached: it may be readable at the next look
            ps.python = (program, found)
        return ps.python[1]

    def peak_text(self, w: Watched) -> str | None:
        """The stack closest to ``w``'s peak, as text (for an oom-kill alert)."""
        ps = self.stacks.get(w.key)
        return ps.peak_text() if ps else None


def _reading(w: Watched, ps: ProcessStacks) -> tuple[int, dict[int, int]] | None:
    """RSS and each thread's CPU ns now, read around a dump: whether memory rose while the
    stack was read, and which threads ran. The RSS is also a reading of the growth
    (``ps.observe``), in time order with the ticks'. None when they cannot be read."""
    try:
        rss, cpu = w.handle.resident_bytes(), w.handle.thread_cpu()
    except MemagentError:
        return None
    ps.observe(rss + (w.vram or 0))
    return rss, cpu
