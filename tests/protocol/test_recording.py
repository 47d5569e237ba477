"""The recording format itself (memproto.recording, docs/recording.md): what a writer puts
in a segment reads back; only changed rows are written and playback makes whole samples
of them; damage is skipped and described, never fatal; what is not a recording, or a
newer format, is refused in one line."""

from __future__ import annotations

import io
import random
import zlib
from pathlib import Path

import msgpack
import pytest

from memproto.codec import encode
from memproto.frames import AlertRaised, Attached, Detached, Exited, Sample
from memproto.framing import frame_bytes
from memproto.recording import (
    FORMAT_VERSION,
    MAGIC,
    MAX_BATCH_BYTES,
    ZDICT,
    HeadroomSnapshot,
    PeakStack,
    Playback,
    RecordingError,
    SegmentHeader,
    SegmentReader,
    SegmentWriter,
    open_recording,
    pack_batch,
)
from memproto.records import Alert, Headroom, HostMemory, ProcessInfo, StackDump
from memproto.version import PROTOCOL_VERSION

MiB = 1024 * 1024


def header(seq: int = 1, start: float = 1000.0, fmt: int = FORMAT_VERSION) -> SegmentHeader:
    return SegmentHeader(fmt, "box", start, 0.5, list(PROTOCOL_VERSION), "test", "daemon", 42, 8 << 30, seq)


def row(pid: int, rss: int, alive: bool = True) -> tuple[object, ...]:
    return (pid, 100.0 + pid, alive, rss, rss, rss // 2, 0, None, None, True, None)


def info(pid: int) -> ProcessInfo:
    return ProcessInfo(pid=pid, start_time=100.0 + pid, name=f"p{pid}", cmdline=["python", "x.py"],
                       label="lab", uid=0, alive=True, attached_at=1.0, exited_at=None, rss_bytes=MiB,
                       rss_peak_bytes=MiB, anon_bytes=0, swap_bytes=0)


def read(data: bytes) -> tuple[SegmentReader, list[object]]:
    reader = SegmentReader(io.BytesIO(data), "seg")
    return reader, list(reader)


def segment(ticks: list[list[tuple[object, ...]]], per_batch: int = 2) -> bytes:
    w = SegmentWriter(header())
    out = w.header_bytes()
    for i, rows in enumerate(ticks):
        w.add_sample(i + 1, 1000.0 + i * 0.5, 0.5, rows)
        if (i + 1) % per_batch == 0:
            out += w.take()
    return out + w.take()


def test_every_frame_type_round_trips() -> None:
    w = SegmentWriter(header())
    dump = StackDump(1001.0, "peak", MiB, None, [])
    alert = Alert(1, "oom-kill", "firing", "critical", "pid:3", 1.0, 0.0, "killed", 1002.0, [], pid=3)
    frames = [Attached(info(3)), PeakStack(3, 103.0, dump),
              HeadroomSnapshot(1003.0, HostMemory(8 << 30, 4 << 30, 0, 0),
                               [Headroom("host", "host", 7 << 30, MiB, 0.0001, 8 << 30, MiB, 0, False, [])]),
              AlertRaised(alert), Exited(3, 103.0, 1004.0, 2 * MiB), Detached(3, 103.0)]
    for f in frames:
        w.add(f)
    reader, got = read(w.header_bytes() + w.take())
    assert reader.header == header() and got == frames and reader.damage == []


def test_only_changed_rows_are_written_and_playback_makes_them_whole() -> None:
    ticks = [[row(1, MiB), row(2, 2 * MiB), row(3, 3 * MiB)],
             [row(1, MiB), row(2, 2 * MiB), row(3, 3 * MiB)],       # idle: no row written
             [row(1, MiB), row(2, 5 * MiB), row(3, 3 * MiB)],       # one changed
             [row(1, MiB), row(2, 5 * MiB), row(3, 3 * MiB, alive=False)]]
    _, frames = read(segment(ticks))
    written = [len(f.rows) for f in frames if isinstance(f, Sample)]
    assert written == [3, 0, 1, 1]
    playback = Playback()
    whole = [playback.feed(f) for f in frames]
    samples = [f for f in whole if isinstance(f, Sample)]
    assert [s.seq for s in samples] == [1, 2, 3, 4]
    assert [[tuple(r) for r in s.rows] for s in samples] == ticks


def test_a_detached_process_leaves_playback() -> None:
    w = SegmentWriter(header())
    w.add_sample(1, 1.0, 0.5, [row(1, MiB), row(2, MiB)])
    w.add(Detached(2, 102.0))
    w.add_sample(2, 1.5, 0.5, [row(1, MiB)])
    playback = Playback()
    _, frames = read(w.header_bytes() + w.take())
    last = [playback.feed(f) for f in frames][-1]
    assert isinstance(last, Sample) and [r[0] for r in last.rows] == [1]


def test_drop_pending_makes_the_next_sample_whole_again() -> None:
    w = SegmentWriter(header())
    w.add_sample(1, 1.0, 0.5, [row(1, MiB), row(2, MiB)])
    head = w.header_bytes() + w.take()
    w.add_sample(2, 1.5, 0.5, [row(1, 2 * MiB), row(2, MiB)])
    assert w.drop_pending() == 1 and w.pending_bytes == 0
    w.add_sample(3, 2.0, 0.5, [row(1, 2 * MiB), row(2, MiB)])
    _, frames = read(head + w.take())
    assert [len(f.rows) for f in frames if isinstance(f, Sample)] == [2, 2]


def test_take_raw_and_pack_batch_are_take() -> None:
    w1, w2 = SegmentWriter(header()), SegmentWriter(header())
    for w in (w1, w2):
        w.add_sample(1, 1.0, 0.5, [row(1, MiB)])
    assert pack_batch(w1.take_raw()) == w2.take() and pack_batch(b"") == b"" and w1.take() == b""


def test_an_idle_tick_costs_bytes_not_rows() -> None:
    """100 processes: a tick where none changed adds a few bytes, one where all did hundreds."""
    rows = [row(pid, pid * MiB) for pid in range(1, 101)]
    idle = (len(segment([rows] * 42)) - len(segment([rows] * 2))) / 40
    busy = (len(segment([[row(p, (p + i) * MiB) for p in range(1, 101)] for i in range(42)]))
            - len(segment([[row(p, (p + i) * MiB) for p in range(1, 101)] for i in range(2)]))) / 40
    assert idle < 60 and busy > 10 * idle, (idle, busy)  # ~42 bytes: the frame, its time and seq


# --------------------------------------------------------------------------- damage


def test_a_cut_short_tail_is_reported_and_what_precedes_it_is_read() -> None:
    data = segment([[row(1, (i + 1) * MiB)] for i in range(10)], per_batch=3)
    full = [f for f in read(data)[1] if isinstance(f, Sample)]
    # Cut at every byte after the header: the reader never fails, reports at most the tail.
    start = len(SegmentWriter(header()).header_bytes())
    for cut in range(start + 1, len(data)):
        reader, frames = read(data[:cut])
        samples = [f for f in frames if isinstance(f, Sample)]
        assert samples == full[:len(samples)]
        assert len(reader.damage) <= 1 and all("incomplete frame" in d for d in reader.damage)
    assert read(data)[0].damage == []


def test_a_corrupt_batch_in_the_middle_ends_the_segment_with_a_line() -> None:
    """What follows a lost batch is not read: its samples list only the rows that changed
    since the lost ones, so they would show wrong values (missing is better than wrong)."""
    w = SegmentWriter(header())
    batches = []
    for i in range(3):
        w.add_sample(i + 1, 1.0 + i, 0.5, [row(1, (i + 1) * MiB)])
        batches.append(w.take())
    body = msgpack.unpackb(batches[1][4:])
    body["z"] = body["z"][:5] + bytes(len(body["z"]) - 5)  # zeroed: not a zlib stream any more
    bad = frame_bytes(msgpack.packb(body, use_bin_type=True))
    reader, frames = read(w.header_bytes() + batches[0] + bad + batches[2])
    assert [f.seq for f in frames if isinstance(f, Sample)] == [1]
    assert len(reader.damage) == 1 and "damaged batch" in reader.damage[0] and "rest of the segment" in reader.damage[0]


def test_a_length_that_cannot_be_one_ends_the_segment_with_a_line() -> None:
    data = segment([[row(1, MiB)]]) + b"\xff\xff\xff\xff" + b"junk"
    reader, frames = read(data)
    assert len([f for f in frames if isinstance(f, Sample)]) == 1
    assert len(reader.damage) == 1 and "stopped at byte" in reader.damage[0]


def test_a_zip_bomb_is_refused_not_inflated() -> None:
    deflater = zlib.compressobj(9, zdict=ZDICT)
    bomb = deflater.compress(bytes(MAX_BATCH_BYTES + MiB)) + deflater.flush()
    assert len(bomb) < MAX_BATCH_BYTES // 100
    frame = frame_bytes(msgpack.packb({"t": "batch", "v": 1, "z": bomb}, use_bin_type=True))
    reader, frames = read(SegmentWriter(header()).header_bytes() + frame + segment([[row(1, MiB)]])[
        len(SegmentWriter(header()).header_bytes()):])
    assert len(reader.damage) == 1 and "more than" in reader.damage[0]
    assert [f.seq for f in frames if isinstance(f, Sample)] == []  # what follows the bomb is not read


def test_a_frame_type_of_a_newer_recorder_is_skipped_quietly() -> None:
    w = SegmentWriter(header())
    w.add_encoded(msgpack.packb({"t": "from_the_future", "v": 1, "x": 1}, use_bin_type=True))
    w.add_sample(1, 1.0, 0.5, [row(1, MiB)])
    reader, frames = read(w.header_bytes() + w.take())
    assert [type(f) for f in frames] == [Sample] and reader.damage == []


@pytest.mark.parametrize("data, says", [
    (b"", "zero bytes"),
    (MAGIC[:5], "cut short or damaged"),
    (b"\x89MEMREX\r\n\x1a\n", "cut short or damaged"),
    (b"PK\x03\x04 a zip file", "not a memagent recording"),
    (MAGIC, "missing or cut short"),
    (MAGIC + frame_bytes(encode(Detached(1, 1.0))), "missing or cut short"),
    (MAGIC + b"\x00\x00\x00\x05ab", "missing or cut short"),
])
def test_what_is_not_a_recording_is_refused_in_one_line(data: bytes, says: str) -> None:
    with pytest.raises(RecordingError) as err:
        SegmentReader(io.BytesIO(data), "f.mrec")
    assert says in str(err.value) and "\n" not in str(err.value) and str(err.value).startswith("f.mrec: ")


def test_a_newer_format_is_refused_in_one_line() -> None:
    data = SegmentWriter(header(fmt=FORMAT_VERSION + 1)).header_bytes()
    with pytest.raises(RecordingError, match=f"recording format {FORMAT_VERSION + 1}; this memagent reads"):
        SegmentReader(io.BytesIO(data), "f.mrec")


# --------------------------------------------------------------------------- several segments


def test_open_recording_orders_segments_and_skips_those_outside_the_window(tmp_path: Path) -> None:
    rnd = random.Random(1)
    for seq in (1, 2, 3):
        w = SegmentWriter(header(seq, start=1000.0 * seq))
        for i in range(3):
            w.add_sample(seq * 10 + i, 1000.0 * seq + i, 0.5, [row(1, rnd.randrange(1, 100) * MiB)])
        (tmp_path / f"2026010{seq}T000000Z-{seq:06d}.mrec").write_bytes(w.header_bytes() + w.take())
    (tmp_path / "notes.txt").write_text("not a segment")
    seqs = [f.seq for f in open_recording([str(tmp_path)]) if isinstance(f, Sample)]
    assert seqs == [10, 11, 12, 20, 21, 22, 30, 31, 32]
    late = [f.seq for f in open_recording([str(tmp_path)], since=2500.0) if isinstance(f, Sample)]
    assert late == [20, 21, 22, 30, 31, 32]  # segment 1 ended before 2500 (2 began at 2000)
    early = [f.seq for f in open_recording([str(tmp_path)], until=1500.0) if isinstance(f, Sample)]
    assert early == [10, 11, 12]


def test_a_segment_dropped_while_reading_is_skipped_but_a_named_file_must_exist(tmp_path: Path) -> None:
    segs = []
    for seq in (1, 2):
        w = SegmentWriter(header(seq, start=1000.0 * seq))
        w.add_sample(seq, 1000.0 * seq, 0.5, [row(1, MiB)])
        segs.append(tmp_path / f"2026010{seq}T000000Z-{seq:06d}.mrec")
        segs[-1].write_bytes(w.header_bytes() + w.take())
    frames = open_recording([str(tmp_path)])
    assert isinstance(next(frames), SegmentHeader)  # the directory listed, segment 1 open
    segs[1].unlink()  # as a recorder dropping a segment would, meanwhile
    assert [f.seq for f in frames if isinstance(f, Sample)] == [1]
    with pytest.raises(FileNotFoundError):
        list(open_recording([str(segs[1])]))
