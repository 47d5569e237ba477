"""End to end: real bursty targets (``bench/bursty_target.py``: a sawtooth of 60-150 MiB
that rises in ten steps and is freed every 1.5-3.6 s, some with request threads) under a
daemon at a low ``[stacks] cpu_budget``: the stack work's CPU, the daemon's own and its
helpers' (py-spy, Austin), stays within the budget over the sliding window, in the daemon's
own accounting (``status``: ``stack_cpu_*``), and the budget binds (bursts are refused)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Daemon, poll

from memagent.proc.austin import find_austin

BURSTY = Path(__file__).resolve().parents[2] / "bench" / "bursty_target.py"
INTERVAL = 0.2
#: Ticks the spend is watched over once the first window is full: 30 s of the daemon's clock.
TICKS = 150
BUDGET = 0.02


@pytest.fixture
def bursty() -> Iterator[list[int]]:
    procs = [subprocess.Popen([sys.executable, str(BURSTY), "--mib", str(mib), "--period", str(period),
                               "--threads", str(threads)], stdin=subprocess.DEVNULL)
             for mib, period, threads in ((60, 1.5, 0), (100, 2.0, 4), (150, 2.5, 0), (80, 3.0, 6))]
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait(10)


def test_the_stack_work_of_bursty_targets_stays_within_the_cpu_budget(
        start_daemon: Callable[..., Daemon], tmp_path: Path, bursty: list[int]) -> None:
    if find_austin() is None:
        pytest.skip("austin is not installed (pip install 'austin-dist<4')")
    conf = tmp_path / "memagent.toml"
    conf.write_text(f"[stacks]\ncpu_budget = {BUDGET}\n")
    d = start_daemon("--config", str(conf), "--interval", str(INTERVAL), "--no-gpu", "--no-record")
    with d.client(timeout=30) as c:
        c.attach(bursty)
        first = c.status()
        window_ticks = int(first.stack_cpu_window / INTERVAL)
        poll("a window's worth of ticks", lambda: c.status().tick.ticks >= first.tick.ticks + window_ticks,
             timeout=60)
        start = c.status()
        rates = []
        while (now := c.status()).tick.ticks < start.tick.ticks + TICKS:
            rates.append(now.stack_cpu_rate)
            poll("a tick", lambda: c.status().tick.ticks > now.tick.ticks, timeout=10)
        end = c.status()
    assert end.stack_cpu_budget == BUDGET and end.stack_cpu_window == 10.0
    spent = (end.stack_cpu_own_seconds + end.stack_cpu_helper_seconds
             - start.stack_cpu_own_seconds - start.stack_cpu_helper_seconds)
    elapsed = (end.tick.ticks - start.tick.ticks) * INTERVAL
    said = (f"spent {spent:.3f} s in {elapsed:g} s; window rates up to {max(rates):.4f}; bursts "
            f"{end.sampler_bursts}, dumps {end.stack_dumps}; {end.stack_sampler_note}")
    assert end.stack_cpu_helper_seconds > 0 and end.stack_cpu_own_seconds > 0 and end.sampler_bursts >= 1, said
    assert "refused" in (end.stack_sampler_note or "") and " 0 refused" not in (end.stack_sampler_note or ""), said
    # Over the run, within the budget; in any one window, over it by at most half (the
    # runs already going when the window filled, charged as they are read).
    assert spent / elapsed <= BUDGET * 1.1, said
    assert max(rates) <= BUDGET * 1.5, said
