"""When to re-read each watched process's PSS, so that Σ peaks follows sharing changes.

Σ peaks subtracts each process's shared excess (``RSS - PSS``, :mod:`.headroom`). Three
changes move that figure while RSS stays put, so the sampler alone never sees them:

* **copy-on-write pages written** by forked workers (in Python reference counting alone
  does it): the pages become private, the box uses more, the excesses shrink;
* **a fork**: parent and child now share the parent's pages;
* **a new process mapping the same file** (a ``/dev/shm`` segment, model weights): the
  segment's pages are shared by one more process.

A PSS read (``smaps_rollup``) walks the process's whole memory map under its mmap lock:
~3.4 µs per resident MiB (``bench/pss_cost.py``), too dear for every tick. So a read is
*triggered*, besides the periodic ``[host] pss_refresh``:

1. **membership**: a process attached (its first read) or gone (exit, detach): its
   partners — parent, children and siblings (same parent PID, not 0 or 1), and processes
   with a sharing key in common (:mod:`memagent.proc.sharing`) — are re-read; one that
   exited leaves its shared pages to those partners at once (:func:`_bequeath`);
2. **kernel events**: a watched process forked or ran a new program (:meth:`touch`,
   from :mod:`memagent.core.process_events`): it and its partners are re-read;
3. **after a read**: when a process's sharing keys or parent changed (a new process's
   first read, a new shared mapping), or its excess moved by :data:`EXCESS_MOVE` or more,
   its partners read before it are re-read (their excesses moved with it);
4. **file-backed memory moved**: its resident file and shared-memory part (statm's
   ``shared``) moved by :data:`SHARED_MOVE` since its last read (it mapped a segment);
5. **drift**: copy-on-write writes show nowhere but in the host's used memory. The
   engine hands over, at each host evaluation, what unwatched processes seem to use
   (``used - Σ(RSS - excess)``); when that moves by ``[host] pss_drift`` (64 MiB) from its
   value after the last read, every process whose *anonymous* excess (``Anonymous -
   Pss_Anon``: pages it shares copy-on-write) is :data:`SHARING_MIN` or more is re-read
   (at most once per :data:`DRIFT_GAP`); where the kernel does not say (before Linux
   5.9), every process with an excess that large. A process that shares only files and
   libraries cannot lose its excess to writes, so the box's other processes moving, or
   its own private memory rising and falling (a model's every batch), never re-read it.

Reads run in a worker thread, one batch of at most :data:`BATCH_MAX` processes at a time,
most overdue first. Their time is drawn from a bucket that fills at :data:`DUTY` of one
CPU and holds at most :data:`BURST` seconds: a batch that overdraws it is followed by
none until it is refilled, so PSS re-reads use at most :data:`DUTY` of one CPU on average
however many processes and triggers there are, while the reads one event makes due (a
fork of a large pool, a new shared segment) run at once. A process's *first* read draws
from a bucket of its own, filling at :data:`FIRST_DUTY`: each process is read for the
first time once, so that bucket is bounded by how fast processes are attached, and 1000
processes attached at a daemon's start are all read within seconds, not the half minute
1 % of a CPU took (their Σ counted each in full until then; issue 26, where that catch-up
was what made the idle fleet's CPU per process-sample look 35 % dearer). Results are
applied on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from ..config import HeadroomConfig
from ..core.registry import Registry
from ..core.watched import Watched
from ..errors import MemagentError
from ..proc.sharing import SharingFacts, SharingKey

log = logging.getLogger(__name__)

MiB: Final = 1024 * 1024
#: The most of one CPU that PSS reads may use, on average.
DUTY: Final = 0.01
#: Seconds of reading that may run at once, ahead of the average (a fork of a 2 GiB pool
#: of 8 workers: ~60 ms), refilled at DUTY.
BURST: Final = 0.25
#: The most of one CPU that first reads may use, on average (their own bucket, of BURST).
FIRST_DUTY: Final = 0.10
BATCH_MAX: Final = 32
#: A process whose excess moved this much at a read: its partners' moved too.
EXCESS_MOVE: Final = 8 * MiB
#: A process whose resident file and shared-memory part moved this much since its last read.
SHARED_MOVE: Final = 16 * MiB
#: An excess below this is left alone by a drift wave (nothing of note to go stale).
SHARING_MIN: Final = 1 * MiB
#: The least time between two drift waves.
DRIFT_GAP: Final = 1.0
#: How long after a process's exit its partners are re-read (its memory is unmapped by then).
EXIT_SETTLE: Final = 0.5

ReadResult = tuple["_Share", float, SharingFacts | None]


@dataclass(slots=True, eq=False)
class _Share:
    """What the tracker knows of one live watched process."""

    w: Watched
    #: When its next read is due (0: now; inf: claimed by the batch in flight).
    due: float = 0.0
    read_at: float = -math.inf
    ppid: int | None = None
    keys: frozenset[SharingKey] = field(default_factory=frozenset)
    #: Resident file and shared-memory bytes (statm) at its last read.
    basis: int = 0
    #: Read ``maps`` too at the next read: the first one, or its file-backed memory moved
    #: (a mapping is a sharing key only once its pages are resident, and then they move).
    keys_stale: bool = True
    #: Not read before this (engine clock): a partner's memory is being unmapped.
    hold_until: float = 0.0
    #: When its last read was applied (engine clock), and its figures before that read.
    applied_at: float = -math.inf
    before: tuple[int, int] | None = None
    #: The anonymous part of its excess at its last read (None: not known).
    anon_excess: int | None = None

    def copy_on_write(self) -> bool:
        """Whether writes may take its excess away unseen (a drift wave re-reads it)."""
        if not self.w.share_known:
            return True
        if self.anon_excess is None:
            return self.w.shared >= SHARING_MIN
        return self.anon_excess >= SHARING_MIN


class ReadBudget:
    """The time PSS reads may take: a bucket that fills at ``duty`` seconds a second up to
    ``burst`` seconds. Reads one event makes due run at once; a stream of them (drift waves
    on a box whose memory never rests) is held to ``duty`` of one CPU on average."""

    def __init__(self, duty: float = DUTY, burst: float = BURST) -> None:
        self.duty, self.burst = duty, burst
        self.credit = burst
        self._filled_at: float | None = None

    def spend(self, spent: float, now: float) -> float:
        """Draw ``spent`` seconds of reading done by ``now``; when the next batch may start."""
        if self._filled_at is not None:
            self.credit = min(self.burst, self.credit + max(0.0, now - self._filled_at) * self.duty)
        self._filled_at = now
        self.credit -= spent
        return now if self.credit >= 0 else now - self.credit / self.duty


class SharingTracker:
    def __init__(self, registry: Registry, config: HeadroomConfig) -> None:
        self.registry = registry
        self.config = config
        self._shares: dict[tuple[int, int], _Share] = {}
        # Who relates to whom, so that finding a process's partners does not walk every
        # process (1000 processes attached at once would make that a million steps).
        self._by_pid: dict[int, _Share] = {}
        self._children: dict[int, set[_Share]] = defaultdict(set)
        self._by_key: dict[SharingKey, set[_Share]] = defaultdict(set)
        self._version = -1
        self._task: asyncio.Task[None] | None = None
        #: When the next batch of re-reads, and of first reads, may start (their budgets).
        self._next_batch = 0.0
        self._next_first = 0.0
        self._budget = ReadBudget()
        self._first_budget = ReadBudget(FIRST_DUTY)
        self._baseline: int | None = None
        self._next_drift = 0.0
        #: No read is due before this (a tick need not look at every process).
        self._next_due = 0.0
        #: The time of the latest tick (the engine's clock, which tests set).
        self._now = 0.0
        #: Reads applied: the engine recomputes the sums when it moves.
        self.reads = 0
        self.drift_waves = 0

    # ------------------------------------------------------------------ triggers

    def touch(self, pid: int) -> None:
        """A watched process forked or ran a new program: it and its partners, now."""
        s = self._by_pid.get(pid)
        if s is not None and s.w.alive:
            self._due_by([s, *self._partners(s)], self._now)

    def on_tick(self, now: float, moved: Iterable[Watched]) -> None:
        """After the sampler: membership changes, memory that moved; then a batch if due."""
        self._now = now
        if self._version != self.registry.version:
            self._sync(now)
        for w in moved:
            s = self._shares.get(w.key)
            if s is not None and abs((w.rss - w.anon) - s.basis) >= SHARED_MOVE:
                s.keys_stale = True
                self._due_by([s], now)
        self._schedule(now)

    def on_unwatched(self, now: float, unwatched: int) -> None:
        """What unwatched processes seem to use, at a host evaluation (trigger 5)."""
        if self._baseline is None:
            self._baseline = unwatched
            return
        if abs(unwatched - self._baseline) < self.config.pss_drift or now < self._next_drift:
            return
        self._next_drift = now + DRIFT_GAP
        self._baseline = None
        self.drift_waves += 1
        self._due_by([s for s in self._shares.values() if s.copy_on_write()], now)
        self._schedule(now)

    async def settled(self) -> None:
        """Wait until the batch in flight and the reads it made due are read and applied
        (for tests: without the duty cycle's pause between batches)."""
        while True:
            if self._task is not None and not self._task.done():
                await self._task
                continue
            self._next_batch = self._next_first = 0.0
            self._schedule(self._now)
            if self._task is None or self._task.done():
                return

    # ------------------------------------------------------------------ bookkeeping

    def _sync(self, now: float) -> None:
        self._version = self.registry.version
        alive = {w.key: w for w in self.registry.alive}
        for key in self._shares.keys() - alive.keys():
            gone = self._shares.pop(key)
            partners = self._partners(gone)
            if gone.w.alive:  # detached
                self._due_by(partners, now)
            else:
                # Its exit is known (taskstats) before the kernel unmaps its memory: a read
                # then finds pages still shared, or half unmapped. A read of its own that
                # close to its end is not trusted; its partners are not read until its
                # memory is gone, and the bequest stands for their re-read meanwhile.
                if now - gone.applied_at < EXIT_SETTLE and gone.before is not None:
                    gone.w.shared, gone.w.shared_resident = gone.before
                for p in partners:
                    p.hold_until = now + EXIT_SETTLE
                self._due_by(partners, now + EXIT_SETTLE)
                _bequeath(gone.w, [p.w for p in partners if p.w.alive])
            self._relate(gone, None, frozenset())
            if self._by_pid.get(gone.w.pid) is gone:
                del self._by_pid[gone.w.pid]
        for key, w in alive.items():
            if key not in self._shares:
                self._shares[key] = self._by_pid[w.pid] = _Share(w)
                self._next_due = 0.0

    def _relate(self, s: _Share, ppid: int | None, keys: frozenset[SharingKey]) -> None:
        """Set ``s``'s parent and sharing keys, in the indexes too (``None``, empty: out)."""
        if s.ppid is not None:
            self._children[s.ppid].discard(s)
            if not self._children[s.ppid]:
                del self._children[s.ppid]
        for k in s.keys - keys:
            self._by_key[k].discard(s)
            if not self._by_key[k]:
                del self._by_key[k]
        s.ppid, s.keys = ppid, keys
        if ppid is not None:
            self._children[ppid].add(s)
        for k in keys:
            self._by_key[k].add(s)

    def _partners(self, s: _Share) -> list[_Share]:
        """The processes whose excess moves when ``s``'s sharing does."""
        found: set[_Share] = set(self._children.get(s.w.pid, ()))
        if s.ppid is not None:
            parent = self._by_pid.get(s.ppid)
            if parent is not None:
                found.add(parent)
            if s.ppid > 1:  # siblings; the orphans adopted by init share nothing for it
                found |= self._children.get(s.ppid, set())
        for k in s.keys:
            found |= self._by_key.get(k, set())
        found.discard(s)
        return list(found)

    def _due_by(self, shares: Iterable[_Share], when: float) -> None:
        for s in shares:
            if s.due != math.inf:  # one in the batch in flight is read anyway
                s.due = min(s.due, when)
                self._next_due = min(self._next_due, s.due)

    # ------------------------------------------------------------------ reads

    def _schedule(self, now: float) -> None:
        firsts_may, again_may = now >= self._next_first, now >= self._next_batch
        if (self._task is not None and not self._task.done()) or not (firsts_may or again_may) \
                or now < self._next_due:
            return
        # First reads before re-reads: when many processes arrive at once (a pool of workers),
        # their partners are re-read once after all of them, not once per batch.
        due = sorted((s for s in self._shares.values() if s.due <= now and s.hold_until <= now),
                     key=lambda s: (s.read_at != -math.inf, s.due))
        first = bool(due) and due[0].read_at == -math.inf and firsts_may
        if first:  # first reads only, on their own budget
            due = [s for s in due[:BATCH_MAX] if s.read_at == -math.inf]
        elif not again_may:
            return  # re-reads only, and their budget is spent: the next batch when it is refilled
        if not due:
            self._next_due = min((max(s.due, s.hold_until) for s in self._shares.values()), default=math.inf)
            return
        due = due[:BATCH_MAX]
        for s in due:
            s.due = math.inf
        self._task = asyncio.ensure_future(self._run(due, first))

    async def _run(self, batch: list[_Share], first: bool) -> None:
        started = time.perf_counter()
        results = await asyncio.to_thread(_read_batch, batch)
        spent = time.perf_counter() - started
        now = self._now
        if first:
            self._next_first = self._first_budget.spend(spent, now)
        else:
            self._next_batch = self._budget.spend(spent, now)
        for s, read_at, facts in results:
            self._apply(s, read_at, facts, now)
        # Reads made due by these (partners, newcomers): the next batch as soon as a budget
        # allows, not at the next tick.
        if self._next_due <= now:
            at = min(self._next_first, self._next_batch)
            asyncio.get_running_loop().call_later(max(0.0, at - now), lambda: self._schedule(max(self._now, at)))

    def _apply(self, s: _Share, read_at: float, facts: SharingFacts | None, now: float) -> None:
        w = s.w
        s.due = now + self.config.pss_refresh
        self._next_due = min(self._next_due, s.due)
        # Exited or detached while it was read: the descriptor may have been reused.
        if not w.alive or w.handle.closed or self._shares.get(w.key) is not s:
            return
        if facts is None:
            return  # not readable: it counts in full (the engine's grace ends, PSS_GRACE)
        old = w.shared
        s.before = (w.shared, w.shared_resident) if w.share_known else None
        s.applied_at = now
        if facts.excess is not None:
            w.shared = facts.excess
        if facts.shared is not None:
            w.shared_resident = facts.shared
        s.anon_excess = facts.anon_excess
        w.share_known = True
        self.reads += 1
        self._baseline = None
        keys = s.keys if facts.keys is None else facts.keys
        relations_changed = facts.ppid != s.ppid or keys != s.keys
        if relations_changed:
            self._relate(s, facts.ppid, keys)
        s.read_at, s.basis = read_at, w.rss - w.anon
        s.keys_stale = s.keys_stale and facts.keys is None
        if relations_changed or abs(w.shared - old) >= EXCESS_MOVE:
            self._due_by([o for o in self._partners(s) if o.read_at < read_at], now)


def _bequeath(gone: Watched, heirs: list[Watched]) -> None:
    """A process exited while partners live on: the pages it shared stay resident in them.

    Its part of Σ peaks keeps none of its shared pages (else a pool whose workers come
    and go would count the shared memory again for each worker gone), and its fair share
    of them (``Shared - (RSS - PSS)``) passes to the heirs' parts at once, split evenly:
    exact when the pages were shared alike, as forked workers share their parent's, and
    what their re-read (due now) would find. Without it, an heir that exits before that
    read (a parent that ends just after its workers) would keep a share nobody counts."""
    if not heirs:
        return
    fair = max(0, gone.shared_resident - gone.shared)
    for heir in heirs:
        heir.shared = max(0, heir.shared - fair // len(heirs))
    gone.shared = max(gone.shared, gone.shared_resident)


def _read_batch(batch: list[_Share]) -> list[ReadResult]:
    """In a worker thread: smaps_rollup takes each target's mmap lock; keep it off the tick."""
    out: list[ReadResult] = []
    for s in batch:
        read_at = time.monotonic()
        facts = None
        if s.w.alive and not s.w.handle.closed:
            try:
                facts = s.w.handle.sharing(keys=s.keys_stale)
            except MemagentError as exc:  # it exited meanwhile, or it is not ours to read
                log.debug("pid %d: PSS not read: %s", s.w.pid, exc)
        out.append((s, read_at, facts))
    return out
