"""The daemon's flight recorder (issue 14, docs/recording.md): real daemons on a state
directory in tmp_path, real processes whose memory changes at every tick
(``record_churn.py``), SIGKILL at arbitrary moments; the recording against what a
subscriber saw. A full disk, other users and planted links: test_recorder_disk.py.

Synchronisation: the recorder's files and ``status`` are polled with a deadline; samples
are awaited on a subscribed client. The sleeps before a SIGKILL are the point of the test
(a kill at an arbitrary moment), not synchronisation.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import Daemon, MiB, poll
from recorder_util import KiB, attach, churn, config, read_segment, segments, sequence, status

from memproto.frames import Attached, Sample
from memproto.recording import SUFFIX, SegmentHeader, SegmentWriter, open_recording
from memproto.version import PROTOCOL_VERSION

INCOMPLETE = "incomplete frame"


# --------------------------------------------------------------------------- crash safety


def test_sigkill_under_load_leaves_every_segment_readable(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """30 processes changing at every 0.05 s tick; the daemon SIGKILLed at random moments,
    three times on the same state directory: each segment reads back, its only damage at
    most one cut-short last frame, and each opens with a keyframe naming every process."""
    state = tmp_path / "state"
    record = state / "record"
    rnd = random.Random(14)
    with churn(30) as pids:
        for round_ in range(3):
            d = start_daemon("--interval", "0.05", "--state-dir", str(state))
            if round_ == 0:
                attach(d, pids, "--label", "churn")
                poll("the state saved", lambda: (state / "state.json").exists())
            # Wait for a batch or two in this daemon's segment, then kill at a random moment.
            poll("a segment with batches", lambda n=round_ + 1: len(segments(record)) == n
                 and segments(record)[-1].stat().st_size > 5 * KiB)
            time.sleep(rnd.uniform(0.0, 1.0))  # the arbitrary moment of the kill
            d.proc.kill()
            d.proc.wait(10)
    files = segments(record)
    assert [sequence(p) for p in files] == [1, 2, 3]
    damaged = 0
    for p in files:
        header, frames, damage = read_segment(p)
        assert header.source == "daemon" and header.interval == 0.05 and header.version == list(PROTOCOL_VERSION)
        assert len(damage) <= 1 and all(INCOMPLETE in line for line in damage), damage
        damaged += len(damage)
        first = next(i for i, f in enumerate(frames) if isinstance(f, Sample))
        keyframe = {(f.process.pid, f.process.start_time) for f in frames[:first] if isinstance(f, Attached)}
        sample = frames[first]
        assert isinstance(sample, Sample)
        assert {(r.pid, r.start_time) for r in sample.records()} == keyframe
        if header.sequence > 1:  # the first began before the attach
            assert {pid for pid, _ in keyframe} == set(pids)
        assert sum(isinstance(f, Sample) for f in frames) > 10
    # Every segment but the last was followed by a restart that read it; all together too.
    sequence_of: dict[int, list[int]] = {}
    current = 0
    for f in open_recording([str(record)]):
        if isinstance(f, SegmentHeader):
            current = f.sequence
        elif isinstance(f, Sample):
            sequence_of.setdefault(current, []).append(len(f.rows))
    # Whole samples: 30 rows at every tick once attached (an attach of 30 may span two ticks).
    assert sequence_of[1] == sorted(sequence_of[1]) and sequence_of[1][-1] == 30
    assert all(n == 30 for seq in (2, 3) for n in sequence_of[seq])
    print(f"{damaged} of {len(files)} segments ended in a cut-short frame")


# --------------------------------------------------------------------------- size bound


def _old_segment(record: Path, seq: int, size: int) -> None:
    """A valid segment from long ago of ``size`` bytes (to 70: one row), its sample frame
    left unpacked (a reader takes plain frames as well as batches) so that its size is exact."""
    start = 1_700_000_000.0 + seq
    name = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(start)) + f"-{seq:06d}{SUFFIX}"

    def build(n: int) -> bytes:
        w = SegmentWriter(SegmentHeader(1, "old", start, 0.5, list(PROTOCOL_VERSION), "test", sequence=seq))
        w.add_sample(1, start, 0.5, [(1000 + i, start, True, *[2**40 + i] * 6, True, None) for i in range(n)])
        return w.header_bytes() + w.take_raw()

    base = len(build(16)) - 16 * 70  # each row: 70 bytes (uint16, float64, 6 x uint64, 2 bools, a nil, array)
    (record / name).write_bytes(build((size - base) // 70))


def test_the_size_bound_drops_the_oldest_segments_first(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    record = state / "record"
    record.mkdir(parents=True, mode=0o700)
    # 1 must go at start (all five and a segment's room are over 1 MiB); 2 after the first
    # ~10 KiB the daemon writes; 3, 4 and 5 only after a MiB: the oldest first, always.
    for seq, size in ((1, 40 * KiB), (2, 995 * KiB), (3, 5 * KiB), (4, 5 * KiB), (5, 5 * KiB)):
        _old_segment(record, seq, size)
    max_bytes, segment_bytes, slack = MiB, 4 * KiB, 64 * KiB  # slack: the batch being written
    cfg = config(tmp_path, f'[record]\nmax_bytes = "1MiB"\nsegment_bytes = "{segment_bytes // KiB}KiB"\n')
    with churn(30) as pids:
        d = start_daemon("--config", cfg, "--interval", "0.05", "--state-dir", str(state))
        poll("the bound enforced at start", lambda: sequence(segments(record)[0]) == 2)
        attach(d, pids)
        seen: list[list[int]] = []

        def rotated_enough() -> bool:
            files = segments(record)
            total = sum(p.stat().st_size for p in files)
            seqs = [sequence(p) for p in files]
            seen.append(seqs)
            assert total <= max_bytes + slack, (total, seqs)
            assert seqs == list(range(seqs[0], seqs[-1] + 1)), seqs  # the oldest went first
            return seqs[0] == 3 and seqs[-1] >= 8

        poll("2 dropped too, with segments of the daemon's own", rotated_enough, timeout=20)
        st = status(d)
        assert st.recording == "on" and st.recording_bytes <= max_bytes + slack
        d.stop()
    firsts = [s[0] for s in seen]
    assert firsts == sorted(firsts) and firsts[0] == 2 and firsts[-1] == 3
    for p in segments(record):
        _, frames, damage = read_segment(p)
        assert damage == [] and frames


# --------------------------------------------------------------------------- the recording is the stream


def test_history_from_the_recorder_equals_what_subscribers_saw(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    seen: dict[int, dict[tuple[int, float], list[Any]]] = {}
    with churn(5) as pids:
        d = start_daemon("--interval", "0.05", "--state-dir", str(state))
        attach(d, pids)
        with d.client() as c:
            c.subscribe()
            for frame in c.stream():
                if isinstance(frame, Sample):
                    seen[frame.seq] = {(r[0], r[1]): list(r) for r in frame.rows}
                    if len(seen) >= 60:
                        break
        d.stop()
    recorded: dict[int, dict[tuple[int, float], list[Any]]] = {}
    damage: list[str] = []
    for frame in open_recording([str(state / "record")], on_damage=damage.append):
        if isinstance(frame, Sample):
            recorded[frame.seq] = {(r[0], r[1]): list(r) for r in frame.rows}
    assert damage == []
    assert seen.keys() <= recorded.keys()
    for seq, rows in seen.items():
        assert recorded[seq] == rows, seq
    moving = {tuple(r[3] for r in rows.values()) for rows in seen.values()}
    assert len(moving) > 30  # the RSS changed from tick to tick: the change-only rows were exercised
