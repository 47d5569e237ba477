"""What the flight recorder refuses to write and what it leaves out (issue 25): non-finite
numbers (NaN, ±inf) never reach a recording; a user over its share of the recorder has
its short-lived processes left out and counted (memagent.store.record_share), root never.
Real writers and a real agent over the fixture /proc tree (as test_flight_recorder.py);
the same with a real daemon and a second user: tests/e2e/test_recorder_share.py."""

from __future__ import annotations

import asyncio
import io
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from proctree import TRAINER, MiB, ProcTree

from memagent.agent import Agent
from memagent.config import AgentConfig, RecordConfig, StackConfig
from memagent.store.record_share import HOLD, SHARE, UserShares
from memproto.codec import encode
from memproto.frames import Attached, Exited, Sample
from memproto.recording import MAGIC, SegmentHeader, SegmentReader, SegmentWriter, Thinned, pack_batch
from memproto.records import SAMPLE_COLUMNS

KiB = 1024


def written(writer: SegmentWriter) -> list[object]:
    data = writer.header_bytes() + pack_batch(writer.take_raw())
    assert data.startswith(MAGIC)
    reader = SegmentReader(io.BytesIO(data))
    frames = list(reader)
    assert reader.damage == []
    return frames


def row(pid: int, rss: object) -> tuple[object, ...]:
    return (pid, 50.0 + pid, True, rss, 2 * MiB, MiB, 0, None, None, True, None)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_refused_when_written(bad: float) -> None:
    """Before: a NaN went into the segment as written, and plot and memtop --replay failed
    on it. Now: the frame, or the row, is not written and is counted."""
    writer = SegmentWriter(SegmentHeader(1, "h", 0.0, 0.5, [1, 6], "test"))
    assert writer.add(Exited(7, 10.0, bad, MiB)) == 0
    assert writer.add(Exited(8, 10.0, 12.0, MiB)) > 0
    assert writer.add_sample(1, 100.0, 0.5, [row(1, MiB), row(2, bad)], SAMPLE_COLUMNS) == 1
    writer.add_sample(2, bad, 0.5, [row(3, MiB)], SAMPLE_COLUMNS)
    frames = written(writer)
    assert [type(f) for f in frames] == [Exited, Sample]
    assert frames[0].pid == 8  # type: ignore[attr-defined]
    assert [r[0] for r in frames[1].rows] == [1]  # type: ignore[attr-defined]
    assert writer.refused == 3
    # A refused row is refused again next time (not remembered as written).
    writer.add_sample(3, 101.0, 0.5, [row(1, MiB), row(2, bad)], SAMPLE_COLUMNS)
    assert writer.refused == 4


def test_a_user_over_its_share_is_held_root_never() -> None:
    shares = UserShares()
    limit = 1000 * KiB
    shares.charge(1, 999, int(limit * SHARE))
    shares.charge(1, 0, 10 * limit)
    assert shares.over(999, limit) and not shares.over(0, limit) and not shares.over(1234, limit)
    shares.forget(1)  # its segment dropped: under again
    assert not shares.over(999, limit) and shares.total == {}


@pytest.fixture
def agent(proc_tree: ProcTree, tmp_path: Path) -> Iterator[Agent]:
    config = AgentConfig(socket=str(tmp_path / "s.sock"), interval=0.5, gpu=False, netlink=False,
                         stacks=StackConfig(enabled=False), state_dir=str(tmp_path / "state"),
                         record=RecordConfig(max_bytes=MiB, segment_bytes=8 * KiB))
    a = Agent(config, procfs=proc_tree.procfs())
    yield a
    a.alerts.close()
    a.registry.close()
    if a.state is not None:
        a.state.close()


def test_a_short_lived_process_of_a_user_over_its_share_is_left_out_and_counted(agent: Agent) -> None:
    (w,) = agent.registry.attach(TRAINER, label="trainer")
    w.uid = 4321  # the fixture's process, as another user's

    async def run() -> None:
        rec = agent.recorder
        await rec.start()
        assert rec.writer is not None
        rec.shares.charge(rec.writer.header.sequence, 4321, int(MiB * SHARE))  # its share used
        rec.attached(w)
        rows, _ = agent.registry.rows()
        rec.sample(1, 1001.0, rows)
        rec.exited(w)
        rec.detached(w)
        await rec.flush()
        assert rec.shares.left_out_total == 1 and not rec.shares.held
        assert "1 short-lived processes of users over their share" in (rec.note() or "")
        rec.stop()
        await rec.run()

    asyncio.run(run())
    frames = [f for p in sorted(Path(agent.recorder.path or "").iterdir())
              for f in SegmentReader(p.open("rb"), p.name)]
    thinned = [f for f in frames if isinstance(f, Thinned)]
    assert [(t.uid, t.processes) for t in thinned] == [(4321, 1)]
    # Its attach went in the keyframe (before it was over), but nothing after: no exit, no row.
    assert not any(isinstance(f, Exited) for f in frames)
    assert all(r[0] != TRAINER for f in frames if isinstance(f, Sample) for r in f.rows)
    assert HOLD > 1


def test_a_held_process_that_lives_on_is_recorded(agent: Agent) -> None:
    (w,) = agent.registry.attach(TRAINER, label="trainer")
    w.uid = 4321

    async def run() -> None:
        rec = agent.recorder
        await rec.start()
        assert rec.writer is not None
        rec.shares.charge(rec.writer.header.sequence, 4321, int(MiB * SHARE))
        rec.attached(w)
        held = rec.shares.held[(w.pid, w.start_time)]
        held.since -= HOLD  # as if it had lived HOLD seconds
        await rec.flush()
        assert not rec.shares.held
        rows, _ = agent.registry.rows()
        rec.sample(1, 1001.0, rows)
        rec.stop()
        await rec.run()

    asyncio.run(run())
    frames = [f for p in sorted(Path(agent.recorder.path or "").iterdir())
              for f in SegmentReader(p.open("rb"), p.name)]
    attached = [f for f in frames if isinstance(f, Attached) and f.process.pid == TRAINER]
    assert len(attached) == 2  # the keyframe's, and the one when it was recorded again
    assert any(r[0] == TRAINER for f in frames if isinstance(f, Sample) for r in f.rows)


def test_a_keyframe_cuts_an_exited_processs_command_line_and_keeps_a_live_ones(agent: Agent) -> None:
    """Issue 25 point 3: keyframes repeated every exited entry's command line whole (up to
    8 KiB, for each of 256 entries, in every segment). An exited one's is written whole
    once, in its ``attached`` frame; keyframes carry it cut (readers keep the whole one:
    tests/protocol/test_fold.py)."""
    (w,) = agent.registry.attach(TRAINER, label="trainer")
    w.cmdline = ["python3", "serve.py", *(f"--arg{i}={'x' * 1000}" for i in range(8))]

    def keyframe_cmdline() -> list[str]:
        (a,) = [f for f in agent.recorder.keyframe(1000.0) if isinstance(f, Attached)]
        return a.process.cmdline

    assert keyframe_cmdline() == w.cmdline  # alive: whole, for a reader that starts here
    w.alive, w.exited_at = False, 1000.0
    cut = keyframe_cmdline()
    assert cut[:2] == ["python3", "serve.py"] and cut[-1] == "…" and sum(map(len, cut)) <= 257
    assert len(encode(Attached(replace(w.info(), cmdline=cut)))) < len(encode(Attached(w.info()))) - 7 * KiB
