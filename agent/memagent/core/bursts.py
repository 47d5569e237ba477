"""Austin bursts: a growing process sampled at 100 Hz for a few seconds at a time.

:class:`memagent.core.stack_collector.StackCollector` starts a burst when a tick sees a
process grow (:meth:`Bursts.start`); the burst runs Austin
(:func:`memagent.proc.austin.sample`) window after window while the growth goes on
(``ProcessStacks.sampling_until``), and credits each round as it arrives
(:meth:`ProcessStacks.record_round`), with the CPU time each of the round's threads used
since the round before (a thread waiting for the GIL is sampled idle, yet runs).

**Austin's CPU is bounded, whatever the targets do.** One Austin run reads every thread
of its target at each sample, so its cost grows with the thread count, which the
target's owner chooses (8 processes x 400 threads growing cost ~45 % of a core). Two
defences, both measured, neither a guess about the targets:

* each window samples a process with many threads less often: one sample every
  ``BURST_INTERVAL_MS`` x ceil(threads / ``THREADS_AT_FULL_RATE``), its thread count
  read as the window starts;
* the stack work as a whole, the daemon's and its helpers', Austin's included, may use
  at most ``[stacks] cpu_budget`` of one core over the last ten seconds
  (:mod:`memagent.core.stack_budget`): once a second (:meth:`Bursts.police`) each run's
  CPU is read from its own ``/proc/PID/stat``; past the budget, the runs that used the most
  in the window are stopped until the rest would fit (their processes wait
  ``BURST_RETRY``: ``cut``), and no burst starts unless the window has room for what an
  Austin run costs, for it and for each one running (``RUN_COST_START``, then the runs'
  own mean: ``refused``). When the 8
  slots are full, a UID that holds fewer than the heaviest holder less one takes one of
  its slots: one user's growing processes cannot hold every slot.

What is spent is shown by ``memagent status`` (the stack CPU line and the sampler's note):
the CPU of the stack work over the window and since the start, the bursts cut and refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable

from memproto.records import StackDump

from ..errors import MemagentError
from ..proc import austin
from ..proc.austin import SampleRound
from ..proc.helper import Helper
from .process_stacks import ProcessStacks
from .stack_budget import WINDOW_S, CpuBudget
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
#: A process with more threads than this is sampled less often (see the module doc).
THREADS_AT_FULL_RATE = 32
#: How often the CPU of the Austin runs is read and held to the budget.
POLICE_EVERY_S = 1.0
#: Readings of each run's CPU kept to choose which to stop: the budget's window.
POLICE_WINDOW = int(WINDOW_S / POLICE_EVERY_S)
#: What an Austin run is taken to cost (CPU seconds) until runs have been measured; the
#: weight of each measured run in the mean that replaces it.
RUN_COST_START = 0.15
RUN_COST_WEIGHT = 0.2
#: At most one log line about cut bursts per this many seconds.
CUT_LOG_EVERY_S = 60.0


class Bursts:
    """The bursts running, by process, and when each process may have its next."""

    def __init__(self, program: str | None, on_peak_stack: Callable[[Watched, StackDump], None],
                 budget: CpuBudget) -> None:
        self.program = program
        self.on_peak_stack = on_peak_stack
        self.started = 0
        #: The stack work's CPU budget, shared with py-spy's dumps ([stacks] cpu_budget).
        self.budget = budget
        #: Bursts stopped at the CPU budget; starts refused (over the budget, or full slots).
        self.cut = 0
        self.refused = 0
        #: The CPU seconds an Austin run costs, as measured (a moving mean of their rusage):
        #: a burst starts only when the budget's window has room for one more.
        self.run_cost = RUN_COST_START
        #: The helper of each burst's current Austin run.
        self._austin: dict[Key, Helper] = {}
        self._uid: dict[Key, int] = {}
        self._policed: float | None = None
        #: The last POLICE_WINDOW readings (CPU per burst): whom to stop, when over.
        self._readings: deque[dict[Key, float]] = deque(maxlen=POLICE_WINDOW)
        self._cut_logged = -math.inf
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        #: Bursts stopped (their process exited, or was detached) that are still reaping
        #: their Austin: awaited at shutdown too, or the loop closes before the kill is reaped.
        self._stopping: set[asyncio.Task[None]] = set()
        self._retry: dict[Key, float] = {}

    def running(self, key: Key) -> bool:
        return key in self._tasks

    def start(self, w: Watched, ps: ProcessStacks) -> None:
        """Sample ``w`` unless it is sampled already, its last burst failed (or was cut)
        lately, the CPU budget's window has no room for one more run, or the slots are full
        and its UID holds its share of them."""
        if self.program is None or w.key in self._tasks or time.monotonic() < self._retry.get(w.key, 0.0):
            return
        # Room for this run and for those running, each taken to cost a run's mean: their
        # CPU is charged as it is read (once a second, and at reap), after they start.
        room_for_one = self.budget.room() >= self.run_cost * (len(self._tasks) + 1)
        if not room_for_one or (len(self._tasks) >= MAX_BURSTS and not self._make_room(w.uid)):
            self.refused += 1
            return
        with contextlib.suppress(RuntimeError):  # no running loop: a tick outside the agent (tests)
            self._tasks[w.key] = asyncio.get_running_loop().create_task(self._burst(w, ps))
            self._uid[w.key] = w.uid
            self.started += 1

    def _make_room(self, uid: int) -> bool:
        """The slots are full: stop the newest burst of the UID that holds the most, if it
        holds more than ``uid`` plus one; False when ``uid`` has its share already."""
        held = Counter(self._uid.values())
        heaviest, most = held.most_common(1)[0]
        if most <= held.get(uid, 0) + 1:
            return False
        newest = next(k for k in reversed(self._uid) if self._uid[k] == heaviest)
        self.stop(newest)
        return True

    def police(self) -> None:
        """Once a second: charge each Austin run's CPU since the last reading; past the
        budget, stop the runs that spent the most in the window until the rest would fit
        (see the module doc)."""
        now = time.monotonic()
        if self._policed is not None and now - self._policed < POLICE_EVERY_S:
            return
        self._policed = now
        self._readings.append({key: helper.poll_cpu() for key, helper in self._austin.items()})
        over = -self.budget.room()
        if over <= 0:
            return
        spent: Counter[Key] = Counter()
        for part in self._readings:
            spent.update({k: v for k, v in part.items() if k in self._tasks})
        cut = 0
        for key, seconds in spent.most_common():
            if over <= 0:
                break
            over -= seconds
            self._retry[key] = now + BURST_RETRY
            self.stop(key)
            cut += 1
        if cut:
            self.cut += cut
            if now - self._cut_logged >= CUT_LOG_EVERY_S:
                self._cut_logged = now
                log.warning("stacks used %.1f %% of a core over %g s (budget %.1f %%): %d burst(s) stopped "
                            "(%d so far)", 100 * self.budget.rate, self.budget.window, 100 * self.budget.share,
                            cut, self.cut)

    def stop(self, key: Key) -> None:
        self._uid.pop(key, None)
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
        self._uid.clear()
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
                self._uid.pop(w.key, None)

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

        def on_start(helper: Helper) -> None:
            self._austin[w.key] = helper

        try:
            return await asyncio.wait_for(
                austin.sample(self.program, w.pid, BURST_SECONDS, self._interval_ms(w), on_round,
                              self.budget.charge, on_start), BURST_SECONDS + 10)
        except asyncio.TimeoutError:
            log.warning("austin on %d did not end in time: killed", w.pid)
            return austin.BurstEnd(0, error="austin hung")
        finally:
            helper = self._austin.pop(w.key, None)
            if helper is not None and helper.cpu_seconds is not None:
                self.run_cost += RUN_COST_WEIGHT * (helper.cpu_seconds - self.run_cost)

    @staticmethod
    def _interval_ms(w: Watched) -> int:
        """The sampling interval of a window on ``w``: longer for a process with many
        threads, each of which Austin reads at every sample."""
        try:
            threads = len(w.handle.thread_cpu())
        except MemagentError:
            return BURST_INTERVAL_MS
        return BURST_INTERVAL_MS * max(1, math.ceil(threads / THREADS_AT_FULL_RATE))
