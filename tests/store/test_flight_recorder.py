"""The flight recorder's parts without a daemon process (memagent.store.recorder): a real
:class:`Agent` over the fixture /proc tree with a real state directory in tmp_path, its
recorder driven by hand (its ticks, its flushes), so that what a segment opens with, the
bound on frames waiting for the disk and rotation can be checked exactly and fast. The
same behaviour with real daemons and processes: tests/e2e/test_recorder.py."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from proctree import TRAINER, MiB, ProcTree

from memagent.agent import Agent
from memagent.config import AgentConfig, ConfigError, RecordConfig, StackConfig, agent_config, validate
from memagent.recordings.timeline import build_timeline
from memagent.store import recorder as recorder_module
from memagent.store.recorder import OFF, ON, FlightRecorder
from memproto.frames import AlertRaised, Attached, Sample
from memproto.recording import HeadroomSnapshot, PeakStack, SegmentReader, open_recording
from memproto.records import Alert, StackDump

KiB = 1024


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


def rows(n: int, rnd: random.Random) -> list[tuple[object, ...]]:
    return [(1000 + i, 50.0 + i, True, *(rnd.randrange(1, 1 << 40) for _ in range(4)), None, None, True, None)
            for i in range(n)]


def segment_frames(path: Path) -> list[object]:
    with path.open("rb") as f:
        reader = SegmentReader(f, path.name)
        frames = list(reader)
        assert reader.damage == []
        return frames


def test_a_segment_opens_with_a_keyframe(agent: Agent, tmp_path: Path) -> None:
    """Every process known, the headroom, the stacks at peak, the alerts firing: a segment
    reads on its own, whatever was dropped before it."""
    (w,) = agent.registry.attach(TRAINER, label="trainer")
    dump = StackDump(999.0, "peak", 3 * MiB, None, [])
    agent.stacks.of(w).at_peak = dump
    alert = Alert(7, "headroom", "firing", "warning", "host", 0.95, 0.9, "high", 999.5, [])
    agent.alerts.book.active[("headroom", "host")] = alert

    async def run() -> None:
        agent.alerts.on_tick(1000.0, [], [])  # the headroom, as a tick computes it
        rec = agent.recorder
        await rec.start()
        assert rec.state == ON
        rows, _ = agent.registry.rows()
        rec.sample(1, 1001.0, rows)
        rec.stop()
        await rec.run()

    asyncio.run(run())
    (seg,) = sorted((tmp_path / "state" / "record").iterdir())
    frames = segment_frames(seg)
    assert [type(f) for f in frames] == [Attached, HeadroomSnapshot, PeakStack, AlertRaised, Sample]
    assert frames[0].process.label == "trainer" and frames[0].process.pid == TRAINER
    assert frames[1].headroom == agent.alerts.headroom and frames[1].host.total_bytes > 0
    assert frames[2].dump == dump and frames[3].alert == alert
    # What history, report and plot make of it: the stack at peak, though it came first.
    track = build_timeline(open_recording([str(seg)])).tracks[(TRAINER, w.start_time)]
    assert track.peak_stack == dump and track.label == "trainer"


def test_frames_waiting_for_a_stuck_disk_are_bounded_and_counted(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recorder_module, "MAX_PENDING", 64 * KiB)
    rnd = random.Random(1)

    async def run() -> None:
        rec = agent.recorder
        await rec.start()
        assert rec.writer is not None
        for seq in range(1, 400):  # no flush: the disk does not take anything
            rec.sample(seq, 1000.0 + seq, rows(50, rnd))
            assert rec.writer.pending_bytes <= 64 * KiB + 8 * KiB  # one tick's frame past the bound, at most
        assert rec.dropped_frames > 0
        assert "frames dropped" in (rec.note() or "")
        rec.stop()
        await rec.run()

    asyncio.run(run())
    # What was written reads right: the sample after a drop lists every row again.
    samples = [f for f in open_recording([agent.recorder.path or ""]) if isinstance(f, Sample)]
    assert samples and all(len(s.rows) == 50 for s in samples)


def test_rotation_keeps_the_bound_and_every_tick(agent: Agent, tmp_path: Path) -> None:
    rnd = random.Random(2)
    ticks: dict[int, list[tuple[object, ...]]] = {}

    agent.config.record.max_bytes = 64 * KiB  # below the file's minimum: a bound reached fast

    async def run() -> None:
        rec = agent.recorder
        await rec.start()
        for seq in range(1, 301):
            ticks[seq] = rows(20, rnd)
            rec.sample(seq, 1000.0 + seq, ticks[seq])
            if seq % 4 == 0:
                await rec.flush()
                assert rec.total_bytes <= 64 * KiB + 4 * KiB  # the bound, and the last batch (4 ticks)
                assert sum(p.stat().st_size for p in record.iterdir()) == rec.total_bytes
        rec.stop()
        await rec.run()

    record = tmp_path / "state" / "record"
    asyncio.run(run())
    names = sorted(p.name for p in record.iterdir())
    assert int(names[-1].split("-")[1].split(".")[0]) > 10  # 8 KiB segments: it rotated, often
    assert not any(n.endswith(".part") for n in names)
    got = {f.seq: [tuple(r) for r in f.rows] for f in open_recording([str(record)]) if isinstance(f, Sample)}
    first = min(got)
    assert first > 100  # the oldest segments went
    assert got == {seq: ticks[seq] for seq in range(first, 301)}  # from the oldest kept on: every tick, whole


def test_without_a_state_dir_or_when_disabled_it_is_off(proc_tree: ProcTree, tmp_path: Path) -> None:
    for state_dir, record, says in ((None, RecordConfig(), "no state directory"),
                                    (str(tmp_path / "st"), RecordConfig(enabled=False), "disabled")):
        a = Agent(AgentConfig(socket=str(tmp_path / "s.sock"), gpu=False, netlink=False, state_dir=state_dir,
                              record=record), procfs=proc_tree.procfs())
        try:
            asyncio.run(a.recorder.start())
            assert a.recorder.state == OFF and says in (a.recorder.note() or "")
            assert a.recorder.path is None and a.recorder.total_bytes == 0
            a.recorder.sample(1, 1.0, [])  # a tick costs nothing and fails nothing
        finally:
            a.registry.close()
            if a.state is not None:
                a.state.close()
    assert not (tmp_path / "st" / "record").exists()


def test_the_note_names_the_directory_only_to_who_sees_all(agent: Agent) -> None:
    rec: FlightRecorder = agent.recorder

    async def run() -> None:
        await rec.start()
        rec._pause(OSError(28, os.strerror(28)))  # as a write that hit a full disk
        rec.stop()
        await rec.run()

    asyncio.run(run())
    mine, theirs = rec.note(True) or "", rec.note(False) or ""
    assert mine.startswith("no space left on device in ") and str(rec.path) in mine
    assert theirs.startswith("no space left on device since ") and str(rec.path) not in theirs
    assert "sampling goes on; retrying every 10 s" in theirs


# --------------------------------------------------------------------------- configuration


def test_the_record_keys_and_the_flag(tmp_path: Path) -> None:
    assert agent_config({}, {}, "/s").record == RecordConfig()
    assert agent_config({}, {"no_record": True}, "/s").record.enabled is False
    values = validate({"record": {"enabled": True, "max_bytes": "64MiB", "segment_bytes": "1MiB",
                                  "retry_interval": 2}})
    r = agent_config(values, {"no_record": True}, "/s").record
    assert (r.enabled, r.max_bytes, r.segment_size, r.retry_interval) == (False, 64 * MiB, MiB, 2.0)
    # The segment size follows the bound: 1/16, from 256 KiB to 16 MiB.
    assert [RecordConfig(max_bytes=m * MiB).segment_size for m in (1, 64, 256, 4096)] == \
        [256 * KiB, 4 * MiB, 16 * MiB, 16 * MiB]
    for bad, key in (({"max_bytes": "512KiB"}, "record.max_bytes"), ({"segment_bytes": "1KiB"}, "record.segment_bytes"),
                     ({"max_bytes": "1MiB", "segment_bytes": "768KiB"}, "record.segment_bytes"),
                     ({"retry_interval": 0}, "record.retry_interval"), ({"enable": True}, "record.enable")):
        with pytest.raises(ConfigError) as err:
            validate({"record": bad})
        assert err.value.key == key


def test_a_reload_applies_the_sizes_and_keeps_enabled(agent: Agent) -> None:
    new = dataclasses.replace(agent.config, record=RecordConfig(enabled=False, max_bytes=2 * MiB,
                                                                retry_interval=3.0))
    applied, kept = agent.reload(new)
    assert set(applied) >= {"record.max_bytes", "record.segment_bytes", "record.retry_interval"}
    assert kept == ["record.enabled"]
    r = agent.recorder.config
    assert r is agent.config.record and (r.enabled, r.max_bytes, r.retry_interval) == (True, 2 * MiB, 3.0)
