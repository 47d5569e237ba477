"""Part 18: ``memtop --replay`` on a long recording: its memory and how soon it shows.

A recording of ``--hours`` (default 1) of ``--processes`` (default 100) busy processes at
the daemon's default interval (0.5 s), every row changing at every tick (the worst case for
the recorder's deltas), is written with the recorder's own encoder
(:class:`memproto.recording.SegmentWriter`): a keyframe per segment, a batch a second, a
headroom snapshot every 10 s, a peak stack and an alert now and then, segments closed at
16 MiB or an hour as the flight recorder closes them. Then, in a process of its own each
(so that ``ru_maxrss`` is the replay's alone), the real :class:`memtop.replay.ReplayApp`
runs headless (Textual's ``run_test``) on it:

* ``first screen``: wall seconds from the app's start to the first screen with the
  recording's first moment on it (the table filled);
* ``end``: then a seek to the recording's end (``End``), seconds until it is shown;
* ``middle``: a seek back to the middle;
* ``RSS``: the process's peak resident memory over all of it (``ru_maxrss``).

With ``--since`` the replay starts half way in (``memtop --replay DIR --since T``).

    .venv/bin/python bench/replay_cost.py [--hours 1] [--processes 100] [--keep DIR]

Targets (issue 26): RSS <= 100 MB, first screen <= 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "agent"), str(ROOT / "protocol"), str(ROOT / "tui")]

from memproto.frames import AlertRaised, Attached  # noqa: E402
from memproto.recording import HeadroomSnapshot, PeakStack, SegmentHeader, SegmentWriter  # noqa: E402
from memproto.records import (  # noqa: E402
    SAMPLE_COLUMNS,
    Alert,
    Contributor,
    Headroom,
    HostMemory,
    ProcessInfo,
    StackDump,
    StackFrame,
    ThreadStack,
)

MiB = 1024 * 1024
GiB = 1024 * MiB
T0 = 1_800_000_000.0
INTERVAL = 0.5
SEGMENT_BYTES = 16 * MiB
SEGMENT_SECONDS = 3600.0
TOTAL = 64 * GiB


def _info(pid: int, rss: int, start: float) -> ProcessInfo:
    return ProcessInfo(pid=pid, start_time=start, name="python3",
                       cmdline=["python3", f"/srv/models/model{pid}.py", "--port", str(8000 + pid % 1000)],
                       label=f"model{pid % 13}", uid=1000, alive=True, attached_at=start, exited_at=None,
                       rss_bytes=rss, rss_peak_bytes=rss, anon_bytes=rss, swap_bytes=0, rss_peak_exact=True,
                       peak_since=start)


def _stack(t: float, size: int) -> StackDump:
    return StackDump(t, "peak", size, None, [ThreadStack(1, "MainThread", True, True, [
        StackFrame("forward", "/srv/models/net.py", 120), StackFrame("serve", "/srv/models/server.py", 44),
        StackFrame("main", "/srv/models/main.py", 7)])], 1)


def write(folder: Path, hours: float, processes: int) -> tuple[float, float, int]:
    """The recording in ``folder``: its first and last times and its size in bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(26)
    pids = list(range(10_000, 10_000 + processes))
    start = {p: T0 - 600 - p for p in pids}
    base = {p: rnd.randrange(100, 1500) * MiB for p in pids}
    period = {p: rnd.uniform(1.5, 3.6) for p in pids}
    peak = dict(base)
    ticks = int(hours * 3600 / INTERVAL)
    sequence, seg_start, writer, out = 0, 0.0, None, bytearray()

    def close() -> None:
        if writer is not None:
            out.extend(writer.take())
            (folder / f"segment-{sequence:06d}.mrec").write_bytes(bytes(out))

    for i in range(ticks):
        t = T0 + i * INTERVAL
        if writer is None or len(out) >= SEGMENT_BYTES or t - seg_start >= SEGMENT_SECONDS:
            close()
            sequence += 1
            seg_start = t
            writer = SegmentWriter(SegmentHeader(1, "replay-bench", t, INTERVAL, [1, 9], "memagent bench", "daemon",
                                                 4242, TOTAL, sequence))
            out = bytearray(writer.header_bytes())
            for p in pids:
                writer.add(Attached(_info(p, base[p], start[p])))
        rows = []
        for p in pids:
            phase = (t % period[p]) / period[p]
            rss = base[p] + int(phase * 100 * MiB) // 4096 * 4096
            if rss > peak[p]:
                peak[p] = rss
            rows.append([p, start[p], True, rss, peak[p], rss, 0, None, None, True, None])
        writer.add_sample(i + 1, t, INTERVAL, rows, SAMPLE_COLUMNS)
        if i % 20 == 0:
            sum_peaks = sum(peak.values())
            writer.add(HeadroomSnapshot(t, HostMemory(TOTAL, TOTAL // 2, 0, 0), [
                Headroom("host", "host memory", TOTAL - 4 * GiB, sum_peaks, sum_peaks / (TOTAL - 4 * GiB), TOTAL,
                         4 * GiB, 0, True, [Contributor(p, f"model{p % 13}", peak[p]) for p in pids[:5]])]))
        if i % 600 == 300:
            p = pids[i % processes]
            writer.add(PeakStack(p, start[p], _stack(t, peak[p])))
            writer.add(AlertRaised(Alert(i, "headroom", "firing", "warning", "host", 1.02, 1.0,
                                         "Σ peaks would use 102% of host memory", t, [], "ratio")))
        if i % 2 == 1:
            out.extend(writer.take())
    close()
    last = T0 + (ticks - 1) * INTERVAL
    size = sum(f.stat().st_size for f in folder.iterdir())
    return T0, last, size


def measure(folder: str, since: str | None) -> dict[str, float]:
    """In this process: the replay app on ``folder``, headless; the figures."""
    from memtop.replay import ReplayApp
    from memtop.widgets.table import ProcessTable

    async def go() -> dict[str, float]:
        started = time.perf_counter()
        kwargs = {"since": float(since)} if since is not None else {}
        app = ReplayApp(folder, paused=True, **kwargs)
        figures: dict[str, float] = {}
        async with app.run_test(size=(160, 50)) as pilot:
            while not app.query_one(ProcessTable).rows:
                await pilot.pause(0.01)
            figures["first_screen_s"] = time.perf_counter() - started
            figures["first_screen_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            t = time.perf_counter()
            app.replayer.seek_to(math.inf)  # End: wherever the index will find it
            while not (app.replayer.engine and app.replayer.engine.at_end and app.replay.seeking is None):
                await pilot.pause(0.01)
            figures["end_s"] = time.perf_counter() - t
            while app.replay.indexing is not None:
                await pilot.pause(0.01)
            figures["indexed_s"] = time.perf_counter() - started
            where = (app.replay.first + app.replay.last) / 2
            t = time.perf_counter()
            app.replayer.seek_to(where)
            while app.replay.seeking is not None or abs(app.replay.clock - where) > 1:
                await pilot.pause(0.01)
            figures["middle_s"] = time.perf_counter() - t
        figures["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return figures

    return asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--processes", type=int, default=100)
    parser.add_argument("--keep", metavar="DIR", help="write the recording here and keep it")
    parser.add_argument("--measure", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--since", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.since)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp) / "record"
        t = time.perf_counter()
        first, last, size = write(folder, args.hours, args.processes)
        took = time.perf_counter() - t
        print(f"recording: {args.hours:g} h of {args.processes} busy processes at {INTERVAL} s, "
              f"{len(list(folder.iterdir()))} segments, {size / MiB:.1f} MiB (written in {took:.1f} s)")
        for title, since in (("from the start", None), ("--since half way", str((first + last) / 2))):
            cmd = [sys.executable, __file__, "--measure", str(folder)] + (["--since", since] if since else [])
            r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TZ": "UTC"}, check=False)
            if r.returncode:
                print(f"{title}: failed\n{r.stderr[-2000:]}")
                continue
            f = json.loads(r.stdout.splitlines()[-1])
            print(f"{title}: first screen {f['first_screen_s']:.2f} s (RSS then {f['first_screen_rss_mb']:.0f} MB), "
                  f"End {f['end_s']:.2f} s, all read {f['indexed_s']:.2f} s, back to the middle {f['middle_s']:.2f} s, "
                  f"peak RSS {f['rss_mb']:.0f} MB   (targets: <= 100 MB, first screen <= 1 s)")


if __name__ == "__main__":
    main()
