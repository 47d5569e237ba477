"""What the stacks of one process tell: the latest, the one at the peak, and where its
memory grew; and the budget all dumps share.

**Attribution** (:class:`ProcessStacks`): growth is credited only to stacks read while
the RSS rose, shared among the threads that ran meanwhile, to the innermost frame of
each, and aggregated by line and by function (the lines of one function together).
This is still correlation from sampling: see ``docs/stacks.md``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from memproto.records import GrowthSite, StackDump, StackFrame, ThreadStack
from memproto.vocabulary import AtPeakState, StackTrigger

from ..proc.austin import SampledThread, SampleRound

MiB = 1024 * 1024

#: Priorities: lower runs first. SAMPLING: the dumps in a row while memory grows.
DEMAND, PEAK, GROWTH, ROTATION, SAMPLING = 0, 1, 2, 3, 4
TRIGGER_NAMES = {DEMAND: StackTrigger.DEMAND, PEAK: StackTrigger.PEAK, GROWTH: StackTrigger.GROWTH,
                 ROTATION: StackTrigger.ROTATION, SAMPLING: StackTrigger.SAMPLING}
MAX_SITES = 200
MAX_THREADS = 256
#: The standard library: ``.../lib/python3.11/x.py`` (not under site-packages).
_STDLIB = re.compile(r"/lib/python\d+\.\d+/(?!(site|dist)-packages/)")
#: A dump counts as read while memory rose when the RSS rose by this much meanwhile: a few
#: pages come and go in any running interpreter; growth worth a stack is faster (10 MiB in
#: 50 ms puts ~2.5 MiB into the ~13 ms a dump takes).
RISE_MIN = 512 * 1024
#: Every thread that ran gets at least this weight (see :func:`thread_weights`).
LIFT_FLOOR = 0.02
#: A sampled round (10 ms) counts as rising when the RSS rose this much since the last:
#: 16 pages; a running interpreter's own few pages come and go below it.
ROUND_RISE_MIN = 64 * 1024
#: A rising round is a stack for the peak only when its attributed thread is credited at
#: least this share of the rise: a bystander in every round (a compute loop whose own
#: short-lived lists top the RSS by a MiB) is credited only the base rate, and its stack
#: is not the peak's.
PEAK_SHARE_MIN = 0.5


def thread_weights(threads: list[ThreadStack], ran: dict[int, int] | None,
                   history: dict[int, list[int]]) -> dict[int, float]:
    """How a growth seen while ``threads`` were read is shared out, by ``thread_id``.

    ``ran``: CPU ns each thread (by kernel TID) used while the dump was read; None when
    unknown. Only threads that ran share (all Python threads when none ran or it is
    unknown). Each is weighted by how much more often memory rose in the windows it ran
    in than in all windows (``history``: TID -> [rising windows it ran in, other windows it ran in];
    key ``-1``: all windows; Laplace smoothed): a thread that runs all the time, rising
    or not (a spinner, a compute loop), runs no more often while memory rises than by
    chance, and gets little; one that runs only while memory grows gets the most.
    """
    with_frames = [t for t in threads if t.frames]
    ran_in = [t for t in with_frames if ran is not None and t.os_thread_id is not None
              and ran.get(t.os_thread_id, 0) > 0]
    chosen = ran_in or with_frames
    if not chosen:
        return {}
    return _shares({t.thread_id: _rate(history.get(t.os_thread_id or -2, [0, 0])) for t in chosen}, history)


def round_weights(candidates: dict[int, SampledThread], threads: int,
                  history: dict[int, list[int]]) -> tuple[dict[int, float], float]:
    """How a sampled round's growth is shared among ``candidates`` (the threads running at
    this sample or the one before: by TID), and the part of it credited at all.

    One Python thread in the process: all of it, to that thread. Else shared as
    :func:`thread_weights` does, by lift over the rising share of all rounds, and only the
    part ``max`` over the candidates of *how often a round with this thread in it rises*
    is credited: a spinner or a compute loop, in every round, is credited that base rate of
    a growth it is the only runner of (the allocator ran between two samples, unseen), not
    all of it; a thread seen running mostly while memory rises, nearly all.
    """
    if threads <= 1 and len(candidates) == 1:
        return {next(iter(candidates)): 1.0}, 1.0
    rates = {tid: _rate(history.get(tid, [0, 0])) for tid in candidates}
    return _shares(rates, history), max(rates.values())


def _shares(rates: dict[int, float], history: dict[int, list[int]]) -> dict[int, float]:
    """Each thread's share, from its rate of rising windows: its lift over the rate of all
    windows (never below 0), plus ``LIFT_FLOOR``, over the sum of them all."""
    base = _rate(history.get(-1, [0, 0]))
    raw = {key: max(0.0, rate - base) + LIFT_FLOOR for key, rate in rates.items()}
    total = sum(raw.values())
    return {key: w / total for key, w in raw.items()}


def _rate(counts: list[int]) -> float:
    """Share of rising windows, Laplace smoothed."""
    return (counts[0] + 1) / (counts[0] + counts[1] + 2)


def learn(history: dict[int, list[int]], ran: dict[int, int] | None, rose: bool) -> None:
    """Count, per TID, the windows a thread ran in, rising or not (see :func:`thread_weights`)."""
    if ran is None:
        return
    history.setdefault(-1, [0, 0])[0 if rose else 1] += 1
    for tid, ns in ran.items():
        if ns > 0:
            entry = history.setdefault(tid, [0, 0])
            entry[0 if rose else 1] += 1
    if len(history) > MAX_THREADS:  # threads come and go: forget the least seen
        for tid in sorted((k for k in history if k != -1), key=lambda k: sum(history[k]))[:len(history) - MAX_THREADS]:
            del history[tid]


def is_library(filename: str) -> bool:
    """A frame of an installed package or of the standard library (not the program's code)."""
    return "/site-packages/" in filename or "/dist-packages/" in filename or _STDLIB.search(filename) is not None


def credited_frame(frames: list[StackFrame]) -> StackFrame:
    """The frame a thread's share goes to: the innermost one of the program's own code, the
    caller of the library (``np.cumsum`` runs in NumPy's ``_wrapfunc``; the line to change
    is the one that called it); the innermost frame when every frame is a library's."""
    return next((f for f in frames if not is_library(f.filename)), frames[0])


class ProcessStacks:
    """Stacks and attribution of one watched process.

    Memory readings come from the ticks (:meth:`on_tick`) and from just before and after
    each dump (:meth:`observe`); the positive steps between consecutive readings add up
    to the *pending* growth. A dump read while the RSS rose (``rss_rise >= RISE_MIN``)
    takes the pending growth, shared among the threads that ran (:func:`thread_weights`),
    each share credited if py-spy saw its thread active; a dump read while it did not
    rise drops it (it was made by code no stack caught: charging it to a later, idle
    stack is what misled before). The stack at peak is the latest such dump whose
    attributed thread was active, within the rise that reached the peak;
    ``at_peak_state`` is ``missed`` when there was none.
    """

    __slots__ = ("at_peak", "at_peak_state", "by_function", "by_line", "dropped", "history", "last_obs",
                 "last_request", "last_rising", "last_taken", "latest", "message", "peak_rise", "peak_time",
                 "peak_total", "pending_growth", "prev_round", "prev_time", "prev_total", "python", "rise_start",
                 "rising", "sampled", "sampling_until", "state")

    def __init__(self) -> None:
        self.state: str | None = None
        self.message: str | None = None
        self.latest: StackDump | None = None
        self.at_peak: StackDump | None = None
        self.at_peak_state: str | None = None
        self.last_rising: StackDump | None = None
        self.pending_growth = 0
        self.dropped = 0
        self.last_obs: int | None = None
        self.prev_total: int | None = None
        self.prev_time = 0.0
        self.rising = False
        self.rise_start = 0.0
        self.peak_total = -1
        self.peak_time = 0.0
        self.peak_rise = 0.0
        self.sampling_until = 0.0
        #: A sampler is attached (Austin): it credits the growth, round by round; the
        #: readings of ticks and dumps then only track the RSS (no double count).
        self.sampled = False
        self.prev_round: dict[int, SampledThread] = {}
        self.history: dict[int, list[int]] = {}
        self.by_line: dict[tuple[str, str, int], list[int]] = {}
        self.by_function: dict[tuple[str, str], list[int]] = {}
        self.last_taken = 0.0
        self.last_request = 0.0
        #: Whether the program it runs maps a Python interpreter, and which program that
        #: was (its name and command line: an exec changes them); None until looked at.
        self.python: tuple[tuple[str, tuple[str, ...]], bool] | None = None

    def observe(self, total: int) -> None:
        """A memory reading (RSS + VRAM), from a tick or around a dump."""
        if self.last_obs is not None and total > self.last_obs and not self.sampled:
            self.pending_growth += total - self.last_obs
        self.last_obs = total

    def on_tick(self, now: float, total: int) -> int | None:
        """This tick's reading; returns its change since the previous tick (None at the first)."""
        self.observe(total)
        prev, self.prev_total = self.prev_total, total
        prev_time, self.prev_time = self.prev_time, now
        if prev is None:
            self.peak_total = max(self.peak_total, total)
            return None
        delta = total - prev
        if delta > 0 and not self.rising:
            self.rising, self.rise_start = True, prev_time
        elif delta <= 0:
            self.rising = False
        if total > self.peak_total:
            self._new_peak(total, now)
        return delta

    def _new_peak(self, total: int, when: float) -> None:
        self.peak_total, self.peak_time = total, when
        self.peak_rise = self.rise_start if self.rising else when
        kept = self.last_rising
        self.at_peak = kept if kept is not None and kept.time >= self.peak_rise else None
        self.at_peak_state = AtPeakState.OK if self.at_peak is not None else AtPeakState.MISSED

    def record(self, dump: StackDump, ran: dict[int, int] | None = None) -> StackDump:
        """A new dump (``ran``: CPU ns per TID while it was read): the latest; the stack at
        peak if read while memory rose to it; and the pending growth credited or dropped.
        Returns it naming the thread with the largest share (``attributed_thread``)."""
        rose = (dump.rss_rise or 0) >= RISE_MIN
        learn(self.history, ran, rose)
        weights = thread_weights(dump.threads, ran, self.history)
        dump = replace(dump, attributed_thread=max(weights, key=lambda k: weights[k]) if weights else None)
        chosen = dump.attributed()
        self.latest = dump
        self.last_taken = dump.time
        growth, self.pending_growth = self.pending_growth, 0
        if not rose:
            self.dropped += growth
            return dump
        if not self.rising:
            self.rising, self.rise_start = True, self.prev_time
        # A stack for the peak only if the thread with the largest share was running when it
        # was read: one that sleeps had finished growing, and its stack is no longer where.
        if chosen is not None and chosen.active:
            self.last_rising = dump
            total = dump.rss_bytes + (dump.vram_bytes or 0)
            if total > self.peak_total:
                self._new_peak(total, dump.time)
            elif self.rise_start == self.peak_rise:  # still the rise that reached the peak
                self.at_peak, self.at_peak_state = dump, AtPeakState.OK
        for thread in dump.threads:
            share = int(growth * weights.get(thread.thread_id, 0.0))
            if share <= 0 or not thread.frames:
                continue
            if not thread.active:  # its growth was made before it went to sleep, elsewhere
                self.dropped += share
                continue
            # Credited to one frame only: counting every frame on the stack would put
            # <module> and main() on top of every table, since they are on every stack.
            leaf = credited_frame(thread.frames)
            _bump(self.by_line, (leaf.name, leaf.filename, leaf.line), share)
            _bump(self.by_function, (leaf.name, leaf.filename), share)
        return dump

    def record_round(self, rnd: SampleRound, rss: int, vram: int | None, now: float,
                     ran: dict[int, int] | None = None) -> StackDump | None:
        """A round of the sampler (``rss``: the RSS after it; ``now``: when it was taken;
        ``ran``: CPU ns each thread used since the round before, None when unknown): its
        RSS change shared among the threads that ran in between (:func:`round_weights`), by
        the stack they were sampled running in at this round or else the one before (a
        thread waiting for the GIL is sampled idle, yet it runs between samples); when it
        rose (``ROUND_RISE_MIN``) and the thread with the largest share is credited at least
        ``PEAK_SHARE_MIN`` of the rise, a stack for the peak. Returns the round's
        :class:`StackDump` when it became the stack at peak, else None."""
        current = {t.tid: t for t in rnd.threads if t.frames_text}
        previous, self.prev_round = self.prev_round, current
        candidates: dict[int, SampledThread] = {tid: t for tid, t in previous.items() if t.active}
        for tid, t in current.items():
            if t.active or (ran is not None and ran.get(tid, 0) > 0 and tid not in candidates):
                candidates[tid] = t
        rose = rnd.rss_change >= ROUND_RISE_MIN
        learn(self.history, dict.fromkeys(candidates, 1), rose)
        growth = rnd.rss_change
        if growth <= 0:
            return None
        if not candidates:
            self.dropped += growth
            return None
        weights, credited = round_weights(candidates, len(current), self.history)
        for tid, weight in weights.items():
            share = int(growth * credited * weight)
            frames = candidates[tid].frames()
            if share > 0 and frames:
                leaf = credited_frame(frames)
                _bump(self.by_line, (leaf.name, leaf.filename, leaf.line), share)
                _bump(self.by_function, (leaf.name, leaf.filename), share)
        self.dropped += growth - int(growth * credited)
        chosen = max(weights, key=lambda k: weights[k])
        if not rose or credited * weights[chosen] < PEAK_SHARE_MIN:
            return None
        total = rss + (vram or 0)
        dump = StackDump(now, StackTrigger.SAMPLING, rss, vram, [
            ThreadStack(tid, None, t.active, False, t.frames(), tid) for tid, t in candidates.items()],
            attributed_thread=chosen, rss_rise=growth)
        self.latest, self.last_taken, self.last_rising = dump, now, dump
        if not self.rising:
            self.rising, self.rise_start = True, self.prev_time
        if total > self.peak_total:
            self._new_peak(total, now)
        elif self.rise_start == self.peak_rise:  # still the rise that reached the peak
            self.at_peak, self.at_peak_state = dump, AtPeakState.OK
        return dump if self.at_peak is dump else None

    def peak_text(self) -> str | None:
        """The stack at the peak, as one line of text (for an oom-kill alert)."""
        dump = self.at_peak
        if dump is None:
            return None
        thread = dump.attributed()
        frames = thread.frames if thread else []
        return "stack at peak: " + " <- ".join(f"{f.name} ({f.filename}:{f.line})" for f in frames[:8])

    def sites(self, limit: int = 20) -> tuple[list[GrowthSite], list[GrowthSite]]:
        lines = sorted(self.by_line.items(), key=lambda kv: -kv[1][0])[:limit]
        funcs = sorted(self.by_function.items(), key=lambda kv: -kv[1][0])[:limit]
        return (
            [GrowthSite(n, f, ln, b, c) for (n, f, ln), (b, c) in lines],
            [GrowthSite(n, f, None, b, c) for (n, f), (b, c) in funcs],
        )


def _bump(table: dict[Any, list[int]], key: Any, growth: int) -> None:
    entry = table.get(key)
    if entry is None:
        if len(table) >= MAX_SITES:  # bounded: forget the smallest site
            del table[min(table, key=lambda k: table[k][0])]
        table[key] = [growth, 1]
    else:
        entry[0] += growth
        entry[1] += 1


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self.clock = clock
        self.tokens = float(self.burst)
        self.stamp = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self) -> float:
        """Take a token; returns 0, or the seconds to wait before one is there (none taken)."""
        self._refill()
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate
