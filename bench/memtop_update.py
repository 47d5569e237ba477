"""memtop at 1000 rows: milliseconds per update (decode + apply + sort + refresh) and RSS.

Runs the real app headless (``App.run_test``) with no daemon: frames are encoded with
memproto as a daemon would send them, decoded and fed to the app exactly as the
connection worker does. Each update is timed from the frame's bytes to a refreshed
screen: every message the update caused has been handled and the screen's compositor
has rendered the changed regions (what ``pilot.pause()`` does, without its idle-wait
sleeps, which would add ~20 ms of doing nothing to every figure).

Targets (issue 3): p95 <= 50 ms per update at 1000 rows; 4 updates/s sustained;
memtop RSS <= 60 MB.

Run alone: ``.venv/bin/python bench/memtop_update.py``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

from memproto import decode, encode, encode_sample
from memproto.frames import ListOk, StatusOk
from memproto.records import SAMPLE_FIELDS, DaemonStatus, HostMemory, ProcessInfo, TickStats

ROWS = 1000
UPDATES = 60
SUSTAIN_SECONDS = 10.0
RATE_HZ = 4.0
MiB = 1024 * 1024
T0 = 1_800_000_000.0


def vm_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def processes() -> list[ProcessInfo]:
    return [
        ProcessInfo(pid=10_000 + i, start_time=T0 + i, name="python3",
                    cmdline=["python3", "-m", f"model_{i}", "--workers", "4"], label=f"model-{i}", uid=1000,
                    alive=True, attached_at=T0, exited_at=None, rss_bytes=(50 + i) * MiB,
                    rss_peak_bytes=(60 + i) * MiB, anon_bytes=(40 + i) * MiB, swap_bytes=0)
        for i in range(ROWS)
    ]


def sample_bytes(seq: int) -> bytes:
    rows = [[10_000 + i, T0 + i, True, (50 + i + (seq * 7 + i) % 13) * MiB, (70 + i) * MiB, (40 + i) * MiB, 0]
            for i in range(ROWS)]
    return encode_sample(seq, T0 + seq * 0.25, 0.25, rows, SAMPLE_FIELDS)


def status_bytes() -> bytes:
    status = DaemonStatus("memagent", 1, 0, T0, 0.25, "/run/memagent/memagent.sock", ROWS, ROWS, 1,
                          TickStats(1, 0.25, 0.0, 0, 0.0), HostMemory(64 * 1024 * MiB, 32 * 1024 * MiB, 0, 0))
    return encode(StatusOk(3, status))


async def update(pilot: Any, app: Any, payload: bytes) -> None:
    """Feed one frame and return once the screen shows it."""
    app.feed(decode(payload))
    await pilot._wait_for_screen()  # every message the update posted is handled
    app.screen._on_timer_update()  # the compositor renders the dirty regions now


async def main() -> int:
    from memtop.app import MemtopApp

    app = MemtopApp("/nonexistent.sock", connect=False)
    async with app.run_test(size=(160, 50)) as pilot:
        app.feed(decode(encode(ListOk(1, processes()))))
        app.feed(decode(status_bytes()))
        await pilot.pause()
        frames = [sample_bytes(seq) for seq in range(1, UPDATES + 1)]
        times = []
        cpu = []
        for payload in frames:
            started, started_cpu = time.perf_counter(), time.process_time()
            await update(pilot, app, payload)
            times.append((time.perf_counter() - started) * 1000)
            cpu.append((time.process_time() - started_cpu) * 1000)
        # Sustained: a frame every 1/RATE_HZ seconds on absolute deadlines; the app keeps
        # up if every update finishes before the next frame is due.
        loop = asyncio.get_running_loop()
        start = loop.time()
        late = 0
        n = int(SUSTAIN_SECONDS * RATE_HZ)
        busy = 0.0
        for i in range(n):
            due = start + i / RATE_HZ
            await asyncio.sleep(max(0.0, due - loop.time()))
            t = time.perf_counter()
            await update(pilot, app, sample_bytes(UPDATES + i + 1))
            spent = time.perf_counter() - t
            busy += spent
            if loop.time() > due + 1 / RATE_HZ:
                late += 1
        rows_shown = len(app.query_one("#table").rows)  # type: ignore[attr-defined]
    times.sort()
    cpu.sort()
    p50 = statistics.median(times)
    p95 = times[int(len(times) * 0.95) - 1]
    rss_mb = vm_kb("VmHWM") / 1024
    print(f"memtop update at {rows_shown} rows (decode + apply + sort + refresh, {len(times)} updates):")
    print(f"  p50 {p50:.1f} ms   p95 {p95:.1f} ms   max {times[-1]:.1f} ms   target p95 <= 50 ms: "
          f"{'PASS' if p95 <= 50 else 'MISS'}")
    print(f"  CPU per update: p50 {statistics.median(cpu):.1f} ms   p95 {cpu[int(len(cpu) * 0.95) - 1]:.1f} ms")
    print(f"  sustained {RATE_HZ:g} updates/s for {SUSTAIN_SECONDS:g} s: {late} late of {n}, "
          f"busy {busy / SUSTAIN_SECONDS * 100:.0f}% of the time: {'PASS' if late == 0 else 'MISS'}")
    print(f"  memtop peak RSS {rss_mb:.1f} MB (VmHWM of the whole benchmark process): "
          f"target <= 60 MB: {'PASS' if rss_mb <= 60 else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
