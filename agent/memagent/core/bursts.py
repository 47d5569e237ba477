"""Austin bursts: a growing process sampled at 100 Hz for a few seconds at a time.

:class:`memagent.core.stack_collector.StackCollector` starts a burst when a tick sees a
process grow (:meth:`Bursts.start`); the burst runs Austin
(:func:`memagent.proc.austin.sample`) window after window while the growth goes on
(``ProcessStacks.sampling_until``), and credits each round as it arrives
(:meth:`ProcessStacks.record_round`), with the CPU time each of the round's threads used
since the round before (a thread waiting for the GIL is sampled idle, yet runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from memproto.records import StackDump

from ..errors import MemagentError
from ..proc import austin
from ..proc.austin import SampleRound
from .process_stacks import ProcessStacks
from .watched import Watched

log = logging.getLogger(__name__)

Key = tuple[int, int]

#: Processes sampled at once, at most; the interval between two samples; how long one
#: Austin run lasts (renewed while the growth goes on); how long after a burst that found
#: no interpreter (a process still starting, not Python) the next may start.
MAX_BURSTS = 8
BURST_INTERVAL_MS = 10
BURST_SECONDS = 5.0
BURST_RETRY = 30.0


class Bursts:
    """The bursts running, by process, and when each process may have its next."""

    def __init__(self, program: str | None, on_peak_stack: Callable[[Watched, StackDump], None]) -> None:
        self.program = program
        self.on_peak_stack = on_peak_stack
        self.started = 0
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        #: Bursts stopped (their process exited, or was detached) that are still reaping
        #: their Austin: awaited at shutdown too, or the loop closes before the kill is reaped.
        self._stopping: set[asyncio.Task[None]] = set()
        self._retry: dict[Key, float] = {}

    def running(self, key: Key) -> bool:
        return key in self._tasks

    def start(self, w: Watched, ps: ProcessStacks) -> None:
        """Sample ``w`` unless it is sampled already, too many are, or its last burst failed lately."""
        if (self.program is None or w.key in self._tasks or len(self._tasks) >= MAX_BURSTS
                or time.monotonic() < self._retry.get(w.key, 0.0)):
            return
        with contextlib.suppress(RuntimeError):  # no running loop: a tick outside the agent (tests)
            self._tasks[w.key] = asyncio.get_running_loop().create_task(self._burst(w, ps))
            self.started += 1

    def stop(self, key: Key) -> None:
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    def forget(self, key: Key) -> None:
        """``key`` is no longer watched."""
        self.stop(key)
        self._retry.pop(key, None)

    def take_all(self) -> list[asyncio.Task[None]]:
        """Every burst not yet done, for the caller to await (the agent stops): the running
        ones cancelled now, the stopping ones as they were. Cancelled once each: a second
        cancel would cut a burst's wait for its Austin run, left to be reaped by nobody."""
        running = list(self._tasks.values())
        self._tasks.clear()
        for task in running:
            task.cancel()
        return [*running, *self._stopping]

    async def _burst(self, w: Watched, ps: ProcessStacks) -> None:
        """Austin on ``w`` for as long as it grows (``sampling_until``), window after window."""
        me = asyncio.current_task()
        ps.sampled = True
        try:
            while w.alive and time.time() < ps.sampling_until:
                end = await self._window(w, ps)
                if not end.rounds:  # not Python (yet), gone, refused: not again for a while
                    self._retry[w.key] = time.monotonic() + BURST_RETRY
                    log.debug("no austin samples of %d: %s", w.pid, end.error)
                    break
        finally:
            ps.sampled, ps.prev_round = False, {}
            if self._tasks.get(w.key) is me:
                del self._tasks[w.key]

    async def _window(self, w: Watched, ps: ProcessStacks) -> austin.BurstEnd:
        """One Austin run: its rounds credited as they come."""
        assert self.program is not None
        cpu: dict[int, int] = {}

        def on_round(rnd: SampleRound, _start: int | None) -> None:
            # The RSS as it is now, read here: Austin's own (its figure at attach plus the
            # changes since) lags the process by what grew before its first reading, and by
            # what grows while no thread holds the GIL (tens of MiB on a fast rise).
            nonlocal cpu
            try:  # and which threads ran since the round before (a GIL-waiter is sampled idle, yet runs)
                rss = w.handle.resident_bytes()
                now_cpu = w.handle.thread_cpu(t.tid for t in rnd.threads)
            except MemagentError:
                return  # gone: its PID may be another process's by now
            ran = {tid: ns - cpu[tid] for tid, ns in now_cpu.items() if tid in cpu} if cpu else None
            cpu = now_cpu
            dump = ps.record_round(rnd, rss, w.vram, time.time(), ran)
            if dump is not None:
                self.on_peak_stack(w, dump)

        try:
            return await asyncio.wait_for(
                austin.sample(self.program, w.pid, BURST_SECONDS, BURST_INTERVAL_MS, on_round), BURST_SECONDS + 10)
        except asyncio.TimeoutError:
            log.warning("austin on %d did not end in time: killed", w.pid)
            return austin.BurstEnd(0, error="austin hung")
