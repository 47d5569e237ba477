"""The tick's memory sample (:class:`Sampler`) over a fixture /proc tree, and the
:class:`Ticker` that runs ticks on absolute deadlines on a real event loop."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable

import pytest
from proctree import TRAINER, WEIRD, KiB, MiB, ProcTree

from memagent.core.registry import Registry
from memagent.core.sampler import Sampled, Sampler, Ticker
from memagent.proc.procfs import PAGE_SIZE
from memproto import decode, encode_sample
from memproto.frames import Sample
from memproto.records import SAMPLE_COLUMNS, TickStats

# --------------------------------------------------------------------------- Sampler


def test_an_unchanged_statm_skips_the_status_read(proc_tree: ProcTree, registry: Registry) -> None:
    (w,) = registry.attach(TRAINER, now=100.0)
    sampler = Sampler(registry, interval=0.1)
    assert sampler.sample(100.1).changed == [w]  # the first tick reads everything
    hwm = w.hwm
    proc_tree.set_status(TRAINER, VmHWM=hwm + 100 * MiB)  # status moves, statm does not
    assert sampler.sample(100.2) == Sampled(exited=[], changed=[])
    assert (w.hwm, w.peak) == (hwm, hwm)


def test_a_changed_statm_updates_rss_and_peak(proc_tree: ProcTree, registry: Registry) -> None:
    (w,) = registry.attach(TRAINER, now=100.0)
    sampler = Sampler(registry, interval=0.1)
    sampler.sample(100.1)
    proc_tree.set_memory(TRAINER, 900 * MiB, shared=100 * MiB)
    assert sampler.sample(100.2) == Sampled(exited=[], changed=[w])
    assert (w.rss, w.anon, w.hwm, w.peak) == (900 * MiB, 800 * MiB, 900 * MiB, 900 * MiB)
    # A sample above the kernel's (stale) high-water mark is a peak too.
    proc_tree.set_memory(TRAINER, 1000 * MiB, hwm=900 * MiB)
    sampler.sample(100.3)
    assert (w.hwm, w.peak) == (900 * MiB, 1000 * MiB)
    # RSS falls, the peak stays; the history slot keeps its largest sample.
    proc_tree.set_memory(TRAINER, 200 * MiB)
    sampler.sample(100.4)
    assert (w.rss, w.peak) == (200 * MiB, 1000 * MiB)
    assert w.history.series() == (101.0, [1000 * MiB])


def test_status_is_reread_every_status_every_ticks_with_statm_unchanged(
    proc_tree: ProcTree, registry: Registry
) -> None:
    """A spike between two ticks shows only in VmHWM: the forced status read finds it."""
    (w,) = registry.attach(TRAINER, now=100.0)
    sampler = Sampler(registry, interval=0.1, status_refresh=1.0)
    assert sampler.status_every == 10
    sampler.sample(100.0)
    first = w.hwm
    proc_tree.set_status(TRAINER, VmHWM=first + 64 * MiB)
    reads: list[tuple[int, int]] = []  # (tick after the first, VmHWM seen after it)
    for n in range(1, 2 * sampler.status_every + 1):
        sampled = sampler.sample(100.0 + n * 0.1)
        if not sampled.exited and sampled.changed:  # a read that found a new VmHWM
            reads.append((n, w.hwm))
            proc_tree.set_status(TRAINER, VmHWM=w.hwm + 64 * MiB)  # another spike, for the next read
    (n1, hwm1), (n2, hwm2) = reads
    assert n1 <= sampler.status_every  # within status_refresh of the last read
    assert n2 - n1 == sampler.status_every
    assert (hwm1, hwm2) == (first + 64 * MiB, first + 128 * MiB)
    assert w.peak == first + 128 * MiB


def test_a_forced_status_read_that_finds_nothing_new_is_no_change(proc_tree: ProcTree, registry: Registry) -> None:
    """What consumers of ``changed`` (the alert sums, stacks, PSS triggers) skip: with
    nothing moving, a tick of 1000 processes costs their statm reads and little more."""
    registry.attach(TRAINER, now=100.0)
    sampler = Sampler(registry, interval=0.1, status_refresh=1.0)
    sampler.sample(100.0)  # the first read after the attach
    ticks = [sampler.sample(100.1 + n * 0.1) for n in range(3 * sampler.status_every)]
    changed = [bool(t.exited or t.changed) for t in ticks]
    assert not any(changed)


def test_a_reset_window_is_sampled_until_the_kernel_mark_passes_its_value_at_the_reset(
    proc_tree: ProcTree, registry: Registry
) -> None:
    """reset-peaks without --kernel: VmHWM (500 MiB, the old window's) is not the new
    window's peak; the samples are (flagged), until VmHWM rises above 500 MiB: that high
    came after the reset, so it is the window's exact peak, spikes between ticks included."""
    proc_tree.set_memory(TRAINER, 500 * MiB)
    (w,) = registry.attach(TRAINER, now=100.0)
    sampler = Sampler(registry, interval=0.1)
    proc_tree.set_memory(TRAINER, 100 * MiB)  # VmHWM stays 500 MiB
    registry.reset_peaks(TRAINER, now=100.05)
    assert proc_tree.read(TRAINER, "clear_refs") == ""
    assert (w.peak, w.peak_exact, w.peak_since) == (100 * MiB, False, 100.05)
    proc_tree.set_memory(TRAINER, 300 * MiB)
    sampler.sample(100.1)
    proc_tree.set_memory(TRAINER, 200 * MiB)
    sampler.sample(100.2)
    assert (w.peak, w.peak_exact) == (300 * MiB, False)
    proc_tree.set_memory(TRAINER, 250 * MiB, hwm=800 * MiB)  # a spike to 800 MiB between two ticks
    sampler.sample(100.3)
    assert (w.peak, w.peak_exact) == (800 * MiB, True)
    assert w.info().rss_peak_exact is True
    # --kernel: clear_refs written, VmHWM (as the kernel then reports it) exact at once.
    proc_tree.set_memory(TRAINER, 250 * MiB, hwm=250 * MiB)
    registry.reset_peaks(TRAINER, now=100.4, kernel=True)
    assert proc_tree.read(TRAINER, "clear_refs") == "5"
    assert (w.peak, w.peak_exact) == (250 * MiB, True)


def test_a_zombie_statm_marks_the_process_exited(proc_tree: ProcTree, registry: Registry) -> None:
    (w,) = registry.attach(TRAINER, now=100.0)
    (other,) = registry.attach(WEIRD, now=100.0)
    sampler = Sampler(registry, interval=0.1)
    sampler.sample(100.1)
    peak = w.peak
    proc_tree.exit(TRAINER, signal=9)  # statm "0 0 0 0 0 0 0"
    assert sampler.sample(100.2).exited == [w]
    assert not w.alive and w.exited_at == 100.2 and w.handle.closed
    assert w.exit_signal == 9
    assert w.peak == peak
    assert registry.alive == [other]
    rows, _ = registry.rows()
    assert [dict(zip(SAMPLE_COLUMNS, row, strict=True))["alive"] for row in rows] == [False, True]
    assert sampler.sample(100.3).exited == []  # not sampled again


def test_rows_follow_the_sample_columns(registry: Registry) -> None:
    (trainer,) = registry.attach(TRAINER, now=100.0)
    (weird,) = registry.attach(WEIRD, now=100.0)
    sampler = Sampler(registry, interval=0.1)
    sampler.sample(100.1)
    rows, uids = registry.rows()
    assert uids == [1000, 1001]
    named = [dict(zip(SAMPLE_COLUMNS, row, strict=True)) for row in rows]
    assert named[0] == {
        "pid": TRAINER, "start_time": trainer.start_time, "alive": True,
        "rss_bytes": 131072 * PAGE_SIZE, "rss_peak_bytes": 812344 * KiB, "anon_bytes": (131072 - 9876) * PAGE_SIZE,
        "swap_bytes": 2048 * KiB, "vram_bytes": None, "vram_peak_bytes": None, "rss_peak_exact": True,
        "oom_score_adj": None,
    }
    assert (named[1]["pid"], named[1]["rss_bytes"], named[1]["rss_peak_bytes"]) == (WEIRD, 768 * PAGE_SIZE, 4096 * KiB)
    frame = decode(encode_sample(1, 100.1, 0.1, rows))  # and a client reads them so
    assert isinstance(frame, Sample)
    assert [(r.pid, r.rss_bytes, r.swap_bytes) for r in frame.records()] == [
        (TRAINER, trainer.rss, trainer.swap), (WEIRD, weird.rss, weird.swap)]


# --------------------------------------------------------------------------- Ticker


async def run_ticks(interval: float, ticks: int, work: Callable[[int], None]) -> tuple[Ticker, list[float]]:
    """Run a Ticker until its ``ticks``-th tick; ``work(n)`` runs in tick n (from 1).
    Returns the ticker and the loop time at which each of the first ``ticks`` ticks began
    (the ticker may run one more before this coroutine wakes: that one is not recorded)."""
    loop = asyncio.get_running_loop()
    times: list[float] = []
    done = asyncio.Event()

    def on_tick(now: float) -> None:
        if done.is_set():
            return
        times.append(loop.time())
        if len(times) == ticks:
            done.set()
        work(len(times))

    ticker = Ticker(interval, on_tick)
    task = asyncio.ensure_future(ticker.run())
    try:
        await asyncio.wait_for(done.wait(), 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return ticker, times


async def test_the_ticker_keeps_to_absolute_deadlines() -> None:
    interval, work = 0.004, 0.002
    _, times = await run_ticks(interval, 7, lambda n: time.sleep(work))  # each tick works half the interval
    elapsed = [t - times[0] for t in times]
    assert all(e >= n * interval - 1e-4 for n, e in enumerate(elapsed))  # never early
    # No drift: sleeping an interval after each tick would space every two ticks by at
    # least interval + work; on deadlines the sleep is shortened by the tick's work.
    assert min(b - a for a, b in itertools.pairwise(times)) < interval + work


async def test_an_overrunning_tick_skips_the_deadlines_it_missed() -> None:
    interval = 0.004

    def work(n: int) -> None:
        if n == 2:
            time.sleep(2.5 * interval)  # from deadline 1 to 3.5: deadlines 2 and 3 are missed

    ticker, times = await run_ticks(interval, 4, work)
    assert ticker.overruns >= 2
    assert ticker.stats().overruns == ticker.overruns
    # No burst to catch up: the next ticks come at deadlines 4 and 5, not at once.
    assert times[2] - times[0] >= 4 * interval - 1e-4
    assert times[3] - times[0] >= 5 * interval - 1e-4


async def test_a_failing_tick_is_logged_and_the_ticker_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    def work(n: int) -> None:
        if n == 1:
            raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="memagent.core.sampler"):
        ticker, times = await run_ticks(0.001, 3, work)
    assert len(times) == 3 and ticker.ticks >= 3
    assert "tick failed" in caplog.text and "boom" in caplog.text


async def test_a_hurried_ticker_ticks_at_once_and_keeps_its_interval_from_there() -> None:
    """``memagent run`` hurries its agent's ticker once CMD has exited (issue 26): the next
    tick runs without waiting for its deadline (an hour away here), and the one after it is
    due an interval after it, not two intervals after the first."""
    interval = 3600.0
    ticker = Ticker(interval, lambda now: None)
    ticker.hurry()  # not running yet: nothing to hurry
    task = asyncio.ensure_future(ticker.run())
    try:
        while ticker.ticks < 1:
            await asyncio.sleep(0)
        ticker.hurry()
        ticker.hurry()  # twice before it ran: still one tick
        for _ in range(100):  # turns of the loop, not seconds: the tick runs at the first
            await asyncio.sleep(0)
        assert ticker.ticks == 2
        assert interval - 60 < ticker.due_in() <= interval
        assert ticker.overruns == 0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_ticker_stats() -> None:
    assert Ticker(0.002, lambda now: None).stats() == TickStats(0, 0.0, 0.0, 0, 0.0)
    interval = 0.002
    ticker, times = await run_ticks(interval, 5, lambda n: time.sleep(0.0005))
    stats = ticker.stats()
    assert stats.ticks == 5
    assert stats.mean_interval == pytest.approx((times[-1] - times[0]) / 4, abs=2e-4)
    assert stats.mean_interval >= interval - 1e-4
    assert stats.last_duration >= 0.0005
    assert stats.overruns == ticker.overruns
    if stats.overruns == 0:  # then tick n's deadline is the n-th after the first tick
        lateness = max(t - times[0] - n * interval for n, t in enumerate(times))
        assert stats.max_lateness == pytest.approx(lateness, abs=2e-4)


def test_an_idle_process_is_read_less_often_at_short_intervals_and_a_change_shows_within_idle_read(
    proc_tree: ProcTree, registry: Registry
) -> None:
    """At 10 Hz, a process unchanged for IDLE_AFTER_S is read every IDLE_READ_S: its statm
    pread happens on a fifth of the ticks (checked by changing statm behind the agent's back
    and seeing when a read notices); the first change after that shows within IDLE_READ_S,
    and from then on every tick."""
    from memagent.core.sampler import IDLE_AFTER_S, IDLE_READ_S

    (w,) = registry.attach(TRAINER, now=100.0)
    sampler = Sampler(registry, interval=0.1, status_refresh=10.0)
    idle_every, idle_after = round(IDLE_READ_S / 0.1), round(IDLE_AFTER_S / 0.1)
    assert (sampler.idle_every, sampler.idle_after) == (idle_every, idle_after)
    tick = 0

    def run(n: int) -> list[int]:
        nonlocal tick
        seen = []
        for _ in range(n):
            tick += 1
            if sampler.sample(100.0 + tick * 0.1).changed:
                seen.append(tick)
        return seen

    run(1 + idle_after)  # the first read, then idle_after unchanged ones: idle now
    proc_tree.set_memory(TRAINER, 700 * MiB)
    assert run(1) == [] and w.rss != 700 * MiB  # not read at this tick
    first = run(idle_every - 1)
    assert len(first) == 1 and w.rss == 700 * MiB  # noticed within IDLE_READ_S
    proc_tree.set_memory(TRAINER, 710 * MiB)
    assert run(1) == [tick]  # active again: read at the very next tick
