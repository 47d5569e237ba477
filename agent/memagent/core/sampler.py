"""The tick: read every watched process's memory, keep peaks and history.

The hot loop reads ``statm`` through an already-open descriptor (~1.3 µs) and compares
the raw bytes with the last tick's; only when they differ, or when the process's
``status_refresh`` period (1 s) is up, does it read ``status`` (~10-13 µs) for the kernel's
peak (VmHWM) and swap. An idle process therefore costs one ``pread`` and a comparison per
tick plus one status read per second: ~2.4 µs a sample at 10 Hz, ~7 µs at 2 Hz
(``bench/``); the forced read is what makes a spike between ticks show within a second
even when statm looks unchanged.

:class:`Ticker` schedules ticks on absolute deadlines (``start + n * interval``) so the
interval does not drift; a tick that overruns skips the deadlines it missed, counted as
overruns, instead of bursting to catch up.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from memproto.records import TickStats

from ..proc.lifecycle import follow_thread
from ..proc.parse import parse_statm_pages, parse_status_memory
from .histogram import Histogram
from .registry import Registry
from .watched import Watched

log = logging.getLogger(__name__)

_STATUS_READ = 16384
#: A process whose statm has not changed for IDLE_AFTER_S is read every IDLE_READ_S instead
#: of every tick (only at intervals shorter than that): at 10 Hz, 1000 idle processes cost
#: a fifth of the reads. Its peak stays exact (VmHWM, read every status_refresh); a change
#: shows within IDLE_READ_S, and from then on every tick.
IDLE_READ_S = 0.5
IDLE_AFTER_S = 2.0


@dataclass(frozen=True, slots=True)
class Sampled:
    """What one tick of the sampler found, handed to the tick's next steps (stacks,
    alerts) instead of left on the sampler for them to read."""

    #: Processes found exited this tick (already marked so in the registry).
    exited: list[Watched]
    #: Processes whose memory figures changed this tick; the others did not, so consumers
    #: skip them, and skip the tick's sums when it is empty.
    changed: list[Watched]


class Sampler:
    def __init__(self, registry: Registry, *, interval: float, status_refresh: float = 1.0,
                 before_exit: Callable[[], None] | None = None) -> None:
        self.registry = registry
        self.interval = interval
        #: Ticks between forced status reads of a process whose statm did not change.
        self.status_every = max(1, round(status_refresh / interval))
        #: An idle process (statm unchanged for IDLE_AFTER_S) is read every this many ticks.
        self.idle_every = max(1, round(IDLE_READ_S / interval))
        self.idle_after = max(1, round(IDLE_AFTER_S / interval))
        self.ticks = 0
        self._slot = -1
        #: Called when a tick found processes gone, before they are marked exited: takes
        #: the kernel's exit records queued by then (see memagent.core.process_events).
        self.before_exit = before_exit

    def sample(self, now: float) -> Sampled:
        """One tick over every live process: the processes found exited, and those whose
        figures changed."""
        tick = self.ticks = self.ticks + 1
        status_every = self.status_every
        exited: list[Watched] = []
        changed: list[Watched] = []
        renamed: list[Watched] = []
        pread = os.pread
        slot = int(now // self.registry.history_step)
        new_slot = slot != self._slot
        self._slot = slot
        idle_every, idle_after = self.idle_every, self.idle_after
        for w in self.registry.alive:
            try:
                if tick < w.next_read and tick < w.status_due:
                    # Idle for a while: read every idle_every ticks (VmHWM, read at least
                    # every status_refresh, keeps its peak exact in between).
                    if new_slot:
                        w.history.add(now, w.rss)
                    continue
                raw = pread(w.statm_fd, 256, 0)
                if raw == w.last_statm and tick < w.status_due:
                    # Unchanged: nothing to record unless the history moved to a new slot.
                    w.quiet += 1
                    if w.quiet >= idle_after:
                        w.next_read = tick + idle_every
                    if new_slot:
                        w.history.add(now, w.rss)
                    continue
                if raw != w.last_statm:
                    w.quiet = w.next_read = 0
                pages = parse_statm_pages(raw)
                if pages is None:  # zombie: the mm is gone (or only its main thread's)
                    _exited_or_moved(w, exited)
                    continue
                raw_status = pread(w.status_fd, _STATUS_READ, 0)
                status = parse_status_memory(raw_status)
                if tick >= w.status_due:  # at most once a status_refresh: a renaming loop costs little
                    _note_name(w, raw_status, renamed)
                # b"": a fresh read was asked for (attach, exec, reset-peaks), which may
                # have changed its figures outside the sampler: a change for the consumers.
                before = w.row if w.last_statm else None
                w.set_memory(pages[0], pages[1], status.hwm_bytes, status.swap_bytes)
                w.last_statm = raw
                # Spread the forced reads of processes attached together over ticks.
                spread = w.pid % status_every if w.status_due == 0 else 0
                w.status_due = tick + status_every - spread
                if w.row != before:  # a forced status read that found nothing new is no change
                    changed.append(w)
            except OSError as exc:
                if exc.errno in (errno.ESRCH, errno.ENOENT):
                    _exited_or_moved(w, exited)
                    continue
                raise
            w.history.add(now, w.rss)
        for w in renamed:  # a new program that no exec event told (polling, an overrun)
            self.registry.refresh_program(w)
        if exited:
            if self.before_exit is not None:
                self.before_exit()
                exited = [w for w in exited if self.registry.entries.get(w.key) is w]
            self.registry.mark_exited(exited, now)
        return Sampled(exited, changed)


def _note_name(w: Watched, raw_status: bytes, renamed: list[Watched]) -> None:
    """Keep the ``Name:`` line of ``w``'s status; a change puts it in ``renamed``: it ran a
    new program, or renamed itself, and no exec event told. Before the first reading the
    line is taken as its name read at attach says (a name the kernel escapes there costs
    one needless re-read of its name and command line, which then finds no change)."""
    head = raw_status[:raw_status.find(b"\n") + 1]
    known = w.status_head or b"Name:\t" + w.name.encode() + b"\n"
    if head != known:
        renamed.append(w)
    w.status_head = head


def _exited_or_moved(w: Watched, exited: list[Watched]) -> None:
    """Its memory read as a zombie's, or its descriptors as gone: the process exited, or
    only the thread they read did (a main thread that called ``pthread_exit``) and the
    process lives on in others: then read through one of those from the next tick on."""
    if follow_thread(w.handle):
        w.statm_fd, w.status_fd = w.handle.statm_fd, w.handle.status_fd
        w.last_statm = b""
        w.status_due = 0
    else:
        exited.append(w)


class Ticker:
    """Runs ``on_tick(now)`` every ``interval`` seconds on absolute deadlines."""

    def __init__(self, interval: float, on_tick: Callable[[float], None]) -> None:
        self.interval = interval
        self.on_tick = on_tick
        self.ticks = 0
        self.overruns = 0
        self.max_lateness = 0.0
        self.last_duration = 0.0
        #: Every tick's duration (memagent_tick_duration_seconds, docs/metrics.md).
        self.durations = Histogram()
        self._first: float | None = None
        self._last: float | None = None
        #: Loop time of the next tick (None until running); see :meth:`due_in`.
        self.deadline: float | None = None
        self._ticked: asyncio.Event | None = None
        #: What the loop awaits between two ticks: its deadline, or :meth:`hurry`, ends it.
        self._wake: asyncio.Future[bool] | None = None

    def hurry(self) -> None:
        """Run the next tick now rather than at its deadline; the ticks after it keep the
        interval from this one. ``memagent run`` asks it once CMD has exited: the exit and
        the figures after it are a tick away, which would otherwise add up to an interval
        to every run (issue 26). On the loop's thread; nothing unless the ticker waits."""
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(True)

    def due_in(self) -> float:
        """Seconds until the next tick is due (negative: it is late); infinite when not
        running. Other work on the loop asks this before a slice, so as not to delay it."""
        if self.deadline is None:
            return math.inf
        return self.deadline - asyncio.get_running_loop().time()

    async def next_tick(self) -> None:
        """Wait until the next tick has run (at once when not running)."""
        if self._ticked is None:
            return
        await self._ticked.wait()

    def stats(self) -> TickStats:
        mean = 0.0
        if self._first is not None and self._last is not None and self.ticks > 1:
            mean = (self._last - self._first) / (self.ticks - 1)
        return TickStats(self.ticks, mean, self.max_lateness, self.overruns, self.last_duration)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        self.deadline = deadline
        self._ticked = asyncio.Event()
        while True:
            now_mono = loop.time()
            lateness = now_mono - deadline
            if self.ticks:
                self.max_lateness = max(self.max_lateness, lateness)
            if self._first is None:
                self._first = now_mono
            self._last = now_mono
            self.ticks += 1
            started = time.perf_counter()
            try:
                self.on_tick(time.time())
            except Exception:
                log.exception("tick failed")
            self.last_duration = time.perf_counter() - started
            self.durations.observe(self.last_duration)
            self._ticked.set()
            self._ticked = asyncio.Event()
            deadline += self.interval
            behind = loop.time() - deadline
            if behind > 0:
                missed = math.floor(behind / self.interval) + 1
                self.overruns += missed
                deadline += missed * self.interval
            self.deadline = deadline
            self._wake = wake = loop.create_future()
            timer = loop.call_at(deadline, _on_time, wake)
            try:
                hurried = await wake
            finally:
                timer.cancel()
            if hurried:  # this tick is the origin of the next ones
                deadline = loop.time()


def _on_time(wake: asyncio.Future[bool]) -> None:
    """The deadline of the tick :class:`Ticker` waits for came (unless it was hurried)."""
    if not wake.done():
        wake.set_result(False)
