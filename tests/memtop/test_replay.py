"""``memtop --replay``: the live screens driven by a recording (``replay_recording.py``: two
segments written with the recorder's own encoder), through Pilot; the command line's
one-line errors through the real ``memtop`` entry in a subprocess."""

from __future__ import annotations

import asyncio
import math
import os
import random
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from replay_recording import (
    END,
    EXIT_TIME,
    EXPORTER,
    HOST,
    PEAK_BYTES,
    PEAK_STACK,
    PEAK_TIME,
    SEGMENT2,
    T0,
    TRAINER,
    MiB,
    peak_before,
    write_long,
    write_recording,
)
from textual.pilot import Pilot

from memproto.recording import RecordingError, SegmentHeader, SegmentWriter, open_recording
from memproto.records import SAMPLE_COLUMNS
from memtop.model import ProcRow
from memtop.replay import ReplayApp
from memtop.replay_data import Index, ReplayEngine, Span
from memtop.replay_types import TIMES
from memtop.widgets.header import MemHeader
from memtop.widgets.stack import StackPanel
from memtop.widgets.table import ProcessTable

#: The installed entry point beside this interpreter (PATH may not have the venv on it, as in CI).
MEMTOP = str(Path(sys.executable).parent / "memtop")


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    """The header shows local time: pin the zone so that it reads the same everywhere."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    folder = tmp_path / "recording"
    write_recording(folder)
    return folder


class NotedReplay(ReplayApp):
    """The replay app, keeping the one-line notices it shows."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.notes: list[str] = []

    def notify(self, message: str, **kwargs: Any) -> None:  # type: ignore[override]
        self.notes.append(message)
        super().notify(message, **kwargs)


async def until(pilot: Pilot[None], predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Let the app run until ``predicate`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await pilot.pause(0.02)


def row(app: ReplayApp, pid: int) -> ProcRow:
    return next(r for r in app.query_one(ProcessTable).rows if r.pid == pid)


def status_line(app: ReplayApp) -> str:
    return str(app.query_one(MemHeader).render().renderables[0])  # type: ignore[attr-defined]


async def seek(pilot: Pilot[None], app: ReplayApp, key: str, expected: float) -> None:
    """Press ``key`` and wait until the replay shows ``expected`` (recorded seconds)."""
    await pilot.press(key)
    await until(pilot, lambda: app.replay.clock == expected and app.snapshot.time <= expected)


async def test_seeking_shows_the_peak_as_it_was_then(recording: Path) -> None:
    app = NotedReplay(str(recording), paused=True)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: not app.replay.loading and app.snapshot.rows != ())
        assert app.replay.clock == T0 and app.replay.paused
        status = status_line(app)
        assert f"⏸ replay 2027-01-15 08:00:00 {TIMES}1" in status and HOST in status and "no daemon" in status
        # +10 s three times: the peak's second. The table shows the recorded peak, the
        # header its time, the stack pane the stack taken at it.
        for n in (1, 2, 3):
            await seek(pilot, app, "right", T0 + 10 * n)
        assert app.replay.clock == PEAK_TIME
        assert row(app, TRAINER).peak == PEAK_BYTES and row(app, TRAINER).rss == PEAK_BYTES
        assert "replay 2027-01-15 08:00:30" in status_line(app)
        assert app.selected_key == (TRAINER, row(app, TRAINER).start_time)
        panel = app.query_one(StackPanel)
        await until(pilot, lambda: panel.reply is not None)
        assert panel.reply is not None and panel.reply.at_peak == PEAK_STACK
        # Back 10 s: before the peak, the smaller peak of then, and no stack at peak yet.
        await seek(pilot, app, "left", T0 + 20)
        assert row(app, TRAINER).peak == peak_before(20) < PEAK_BYTES
        assert panel.reply is None and "replay 2027-01-15 08:00:20" in status_line(app)
        assert row(app, EXPORTER).alive and not app.snapshot.alerts
        # A minute on (the second segment): the exporter has exited, the alert fired.
        await seek(pilot, app, "shift+right", T0 + 80)
        assert not row(app, EXPORTER).alive and row(app, TRAINER).peak == PEAK_BYTES
        assert [a.state for a in app.model.recent_alerts] == ["resolved"]
        await seek(pilot, app, "shift+left", T0 + 20)
        assert row(app, TRAINER).peak == peak_before(20) and row(app, EXPORTER).alive
        await seek(pilot, app, "end", END)
        assert row(app, TRAINER).peak == PEAK_BYTES and "end" in status_line(app)
        await seek(pilot, app, "home", T0)
        assert row(app, TRAINER).peak == peak_before(0)
        # Live requests: one line each, nothing else happens.
        await pilot.press("a", "d", "r")
        assert app.notes == ["attach needs a live daemon: this is a recording",
                             "detach needs a live daemon: this is a recording",
                             "reset peak needs a live daemon: this is a recording"]
        assert len(app.screen_stack) == 1


async def test_speed_keys_and_pause(recording: Path) -> None:
    app = NotedReplay(str(recording), paused=True, speed=4)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: not app.replay.loading)
        assert f"{TIMES}4" in status_line(app)
        await pilot.press(*["plus"] * 6)
        assert app.replay.speed == 64 and f"{TIMES}64" in status_line(app)
        await pilot.press(*["minus"] * 8)
        assert app.replay.speed == 1 and f"{TIMES}1 " in status_line(app)
        await pilot.press("right_square_bracket", "right_square_bracket", "left_square_bracket")
        assert app.replay.speed == 2
        # Paused, the time holds.
        held = app.replay.clock
        await pilot.pause(0.3)
        assert app.replay.clock == held
        # Playing at 64x, it moves (and the header with it); paused again, it holds.
        await pilot.press(*["plus"] * 5, "space")
        assert "▶ replay" in status_line(app)
        await until(pilot, lambda: app.replay.clock >= T0 + 20)
        await pilot.press("space")
        await until(pilot, lambda: app.replay.paused)
        held = app.replay.clock
        await pilot.pause(0.3)
        assert app.replay.clock == held and "⏸ replay" in status_line(app)


async def test_plays_to_the_end_in_recorded_time(recording: Path) -> None:
    """At 64x the two minutes take about two seconds; the end holds, and the table then
    shows what the recording ends with."""
    app = NotedReplay(str(recording), speed=64)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: not app.replay.loading)
        started = time.monotonic()
        seen: list[float] = []

        def ended() -> bool:
            seen.append(app.replay.clock)
            return app.replay.at_end

        await until(pilot, ended)
        took = time.monotonic() - started
        assert 1.0 < took < 6.0, took  # 119 recorded seconds / 64
        assert seen == sorted(seen) and len(set(seen)) > 10  # the clock moved on, step by step
        assert app.replay.paused and row(app, TRAINER).peak == PEAK_BYTES and not row(app, EXPORTER).alive
        assert app.snapshot.time == END
        # Space at the end plays again from the start.
        await pilot.press("space")
        await until(pilot, lambda: app.replay.clock < EXIT_TIME)


async def test_a_gap_is_crossed_in_about_a_second(tmp_path: Path) -> None:
    write_recording(tmp_path, gap=3600)
    app = NotedReplay(str(tmp_path), paused=True)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: not app.replay.loading)
        await seek(pilot, app, "shift+right", T0 + 60)  # in the gap: the first segment's last sample shown
        assert app.snapshot.time == T0 + 59
        await pilot.press("space")
        started = time.monotonic()
        await until(pilot, lambda: app.snapshot.time >= SEGMENT2 + 3600)
        assert time.monotonic() - started < 3.0
        assert any(n.startswith("no data for 60 min (2027-01-15 08:00:59 to 2027-01-15 09:01:00)") for n in app.notes)


async def test_a_cut_short_segment_plays_and_says_so(recording: Path) -> None:
    first = sorted(recording.iterdir())[0]
    first.write_bytes(first.read_bytes()[:-7])  # a recorder killed while writing its last batch
    app = NotedReplay(str(recording), paused=True)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: not app.replay.loading and bool(app.notes))
        assert "incomplete frame" in app.notes[0]
        await seek(pilot, app, "end", END)
        assert row(app, TRAINER).peak == PEAK_BYTES


async def test_a_recording_that_cannot_be_read_is_said_in_the_header(tmp_path: Path) -> None:
    """The command line checks first; a file gone meanwhile is said on the screen."""
    app = NotedReplay(str(tmp_path / "gone.mrec"))
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: bool(app.replay.error))
        assert "replay of" in status_line(app) and "No such file or directory" in status_line(app)
        assert app.notes == [f"cannot replay {tmp_path}/gone.mrec: No such file or directory"]


def test_the_replay_screen(snap_compare: Any, recording: Path) -> None:
    """Paused at the peak: the recorded time, speed and host in the header, the peak in the
    table, the stack at the peak in the detail pane, the replay keys in the footer."""

    async def at_peak(pilot: Pilot[Any]) -> None:
        app = pilot.app
        assert isinstance(app, ReplayApp)
        await until(pilot, lambda: not app.replay.loading)
        app.replayer.seek_to(PEAK_TIME + 5)
        await until(pilot, lambda: app.replay.clock == PEAK_TIME + 5)
        await pilot.pause()

    assert snap_compare(ReplayApp(str(recording), paused=True, speed=8), terminal_size=(120, 30),
                        run_before=at_peak)


def test_a_seek_builds_what_a_straight_play_showed(recording: Path) -> None:
    """At every frame's time, in random order, from checkpoints, from the model shown or
    from the start: the same rows, alerts and headroom as when the recording is played
    straight through."""
    span = Span.open(str(recording))
    straight = ReplayEngine(span)
    index = Index(span, every=7.0)
    index.run()
    moments = []
    while not straight.at_end:
        moments.append(straight.next_time)
        straight.advance(straight.next_time)
    expected = {}
    straight = ReplayEngine(span)
    for t in moments:
        straight.advance(t)
        expected[t] = straight.model.snapshot()
    order = moments * 2
    random.Random(14).shuffle(order)
    ways: dict[str, int] = {}
    # With the index's checkpoints, and with an index that has not read yet (none).
    for seeker in (ReplayEngine(span, index), ReplayEngine(span, Index(span))):
        for t in order:
            base, _ = seeker.plan(t)
            way = "in place" if base is seeker.head else type(base).__name__
            ways[way] = ways.get(way, 0) + 1
            if base is seeker.head:
                seeker.advance(t)
            else:
                seeker.install(seeker.build(base, t), t)
            got = seeker.model.snapshot()
            assert got.rows == expected[t].rows and got.alerts == expected[t].alerts, (t, way)
            assert got.headroom == expected[t].headroom and got.time == expected[t].time
    assert len(index.checkpoints) > 10
    # Every way was taken: from a checkpoint (a reader resumed inside a batch), from the
    # start, on from the model shown (in place, and a copy of it when the way is longer).
    assert ways.keys() == {"Checkpoint", "NoneType", "in place", "Playhead"}, ways


def test_a_long_recording_is_never_held_whole(tmp_path: Path) -> None:
    """Half an hour of 60 processes whose every row changes at every sample: read to the
    end, the index and three seeks together hold a small part of what reading it whole
    did (issue 26: about 250 MB per hour of 100 busy processes); the last moment is the
    recording's."""
    path = write_long(tmp_path / "long", samples=2000, processes=60)
    tracemalloc.start()
    try:
        engine = ReplayEngine(Span.open(str(path)))
        engine.index.run()
        for t in (math.inf, (engine.first + engine.last) / 2, engine.first + 10):
            engine.seek(t)
        replay = tracemalloc.get_traced_memory()[1]
        assert engine.index.last == T0 + 1999 * 0.5 and engine.index.samples == 2000
        engine.close()
        tracemalloc.reset_peak()
        whole = len(list(open_recording([str(path)])))
        held = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert whole == 1 + 60 + 2000
    assert replay < 8 * MiB and replay * 10 < held, (replay, held)


async def test_end_before_the_index_has_read_shows_the_recordings_end(tmp_path: Path) -> None:
    """End pressed at once on a long recording: the seek waits for the index (the header
    says how far it has read meanwhile), then shows the last sample; the header's end is
    the recording's."""
    write_long(tmp_path / "long", samples=2000, processes=60)
    app = NotedReplay(str(tmp_path / "long"), paused=True)
    lines: list[str] = []
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: not app.replay.loading and app.snapshot.rows != ())
        await pilot.press("end")
        await until(pilot, lambda: lines.append(status_line(app)) or (app.replay.indexing is None
                                                                      and app.replay.seeking is None
                                                                      and app.snapshot.time == T0 + 999.5), 30)
        assert app.replay.clock == app.replay.last == T0 + 999.5 and app.replay.at_end
        assert "end" in status_line(app) and "reading" not in status_line(app)
        assert all("Traceback" not in line for line in lines)


def test_since_and_until_play_that_range(recording: Path) -> None:
    """--since in the second segment: that segment read from its start (its rows then are
    those of a straight play), the first moment shown is --since; --until ends there. A
    --since in the first segment shows exactly what a straight play showed then."""
    straight = ReplayEngine(Span.open(str(recording)))
    straight.advance(T0 + 75)
    whole = {r.pid: (r.rss, r.peak, r.alive) for r in straight.model.snapshot().rows}
    engine = ReplayEngine(Span.open(str(recording), since=T0 + 75, until=T0 + 100))
    assert [name for name, _ in engine.span.segments] == [str(recording / "segment-0002.mrec")]
    engine.advance(engine.first)
    assert engine.clock == T0 + 75 and engine.model.time == T0 + 75
    assert {r.pid: (r.rss, r.peak, r.alive) for r in engine.model.snapshot().rows} == whole
    engine.seek(math.inf)
    assert engine.at_end and engine.clock == T0 + 100 and engine.model.time == T0 + 100
    early = ReplayEngine(Span.open(str(recording), since=T0 + 20))
    early.advance(early.first)
    straight = ReplayEngine(Span.open(str(recording)))
    straight.advance(T0 + 20)
    assert early.model.snapshot().rows == straight.model.snapshot().rows
    with pytest.raises(RecordingError, match="nothing recorded in the range asked for"):
        Span.open(str(recording), until=T0 - 10)


@pytest.mark.parametrize(("args", "message"), [
    (["--replay", "{missing}"], "memtop: cannot read {missing}: No such file or directory"),
    (["--replay", "{text}"], "memtop: {text}: not a memagent recording"),
    (["--replay", "{empty}"], "memtop: {empty}: no recording segments (*.mrec) in it"),
    (["--replay", "{recording}", "--until", "@1799999000"],
     "memtop: {recording}: nothing recorded in the range asked for"),
    (["--replay", "{recording}", "--since", "yesterday"],
     "memtop: error: --since: not a time: 'yesterday' (expected e.g. 2h, 30m, 2026-11-30T14:00 or @UNIX)"),
    (["--replay", "{recording}", "--since", "@1800000100", "--until", "@1800000050"],
     "memtop: error: --until is before --since"),
    (["--since", "2h"], "memtop: error: --since is the replay's: only with --replay"),
])
@pytest.mark.e2e
def test_a_file_that_does_not_play_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    """Checked before any screen: no terminal is needed to be told."""
    names = {"missing": str(tmp_path / "nothing.mrec"), "text": str(tmp_path / "notes.txt"),
             "empty": str(tmp_path / "empty"), "recording": str(tmp_path / "recording")}
    write_recording(tmp_path / "recording")
    Path(names["text"]).write_text("not a recording\n")
    Path(names["empty"]).mkdir()
    r = subprocess.run([MEMTOP, *(a.format(**names) for a in args)], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=30)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    if "error: " in message:  # a usage error: argparse's usage lines, then the one line
        lines = lines[-1:]
    assert lines == [message.format(**names)]


@pytest.mark.parametrize(("extra", "flag"), [
    (["--embedded"], "--embedded"), (["--no-embedded"], "--no-embedded"), (["--interval", "1"], "--interval"),
])
@pytest.mark.e2e
def test_replay_with_a_live_option_is_a_usage_error(recording: Path, extra: list[str], flag: str) -> None:
    r = subprocess.run([MEMTOP, "--replay", str(recording), *extra], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=30)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[-1] == f"memtop: error: --replay plays a recording, without an agent: not with {flag}"


async def test_a_directory_with_damaged_segments_plays_the_rest_and_says_so(tmp_path: Path) -> None:
    """Good segments, damaged ones and paths named ``*.mrec`` that are no files (a FIFO
    would hang a reader that opened it): the good ones play, the damage is one notice each
    (the first few, then a count); a file name is shown as text, not as markup."""
    from damaged_recordings import GOOD_PID, damaged_directory

    folder = tmp_path / "record"
    bad = damaged_directory(folder)
    (folder / "[b]x[i].mrec").write_bytes(b"")  # as markup, the name would show as "x"
    app = NotedReplay(str(folder), paused=True)
    async with app.run_test(size=(120, 36)) as pilot:
        await until(pilot, lambda: not app.replay.loading and len(app.notes) >= 4)
        assert not app.replay.error
        assert app.notes[0].startswith(f"{folder}/[b]x[i].mrec: zero bytes")
        assert not any(n.markup for n in app._notifications)
        damaged = len(bad) + 2 + 1  # the files, two segments damaged inside, the markup one
        assert app.notes[3] == f"and {damaged - 3} more damaged parts skipped"
        app.replayer.seek_to(app.replay.last)
        await until(pilot, lambda: app.replay.clock == app.replay.last)
        assert row(app, GOOD_PID).rss > 0


def test_at_the_end_of_a_live_recorder_the_last_state_shows(recording: Path) -> None:
    """A third segment a live recorder has just begun (its header on disk, its keyframe not
    yet): ``End`` shows the processes as they last were, not an empty table under old
    alerts (issue 28); a segment that really lists nobody still empties it."""
    writer = SegmentWriter(SegmentHeader(1, HOST, END + 1, 1.0, [1, 6], "memagent test", "daemon", 4242,
                                         16 * 1024**3, 3))
    (recording / "segment-0003.mrec").write_bytes(writer.header_bytes())
    engine = ReplayEngine(Span.open(str(recording)))
    engine.seek(math.inf)
    assert engine.at_end and {r.pid for r in engine.model.snapshot().rows} == {TRAINER, EXPORTER}
    writer.add_sample(200, END + 2, 1.0, [], SAMPLE_COLUMNS)  # the segment goes on: nobody is watched
    (recording / "segment-0003.mrec").write_bytes(writer.header_bytes() + writer.take())
    engine = ReplayEngine(Span.open(str(recording)))
    engine.seek(math.inf)
    assert engine.model.snapshot().rows == ()
