"""The helpers' reaping (``memagent.proc.children``), on real child processes."""

from __future__ import annotations

import asyncio
import sys

import pytest

from memagent.proc.children import kill_and_reap
from memagent.proc.helper import no_charge, spawn

pytestmark = pytest.mark.e2e  # every test here starts processes (tests/tiers.py)

#: A helper that writes far more than its reader's limit, as Austin on a process of
#: hundreds of threads does in a second.
CHATTY = "import sys\nwhile True: sys.stdout.write('x' * 100 + '\\n'); sys.stderr.write('e' * 100 + '\\n')"


async def test_a_helper_cancelled_mid_output_is_reaped() -> None:
    """Its reader stopped after one line and its pipes filled: the stream's transport is
    paused and would never see the pipe's end, so a bare ``wait()`` hung for good (a
    daemon that never stopped on SIGTERM after an Austin burst on a 200-thread process)."""
    proc = await spawn([sys.executable, "-c", CHATTY], no_charge, limit=1024)
    assert proc.stdout is not None
    await proc.stdout.readline()
    # Let it fill the 64 KiB pipes and our 2 KiB buffer: the transport pauses reading.
    while len(proc.stdout._buffer) < 2048:  # type: ignore[attr-defined]
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    # A hang (before the fix) is pytest-timeout's to report: kill_and_reap outlives cancels.
    cpu = await kill_and_reap(proc)
    assert proc.returncode is not None and proc.returncode < 0
    assert cpu is not None and cpu > 0  # its rusage, charged to the stack budget
