"""Damaged recordings for the readers' tests (docs/security.md, "Damaged recordings"):
segments written by the recorder's own encoder (:class:`memproto.recording.SegmentWriter`),
then damaged as a power loss, a full disk or a user would: cut to zero bytes or mid-frame,
a byte of the header flipped, a batch corrupted, NaN and infinities put into frames through
raw msgpack, and paths named ``*.mrec`` that are not files (a FIFO, a directory, a link to
a FIFO). :func:`mutations` makes random ones, seeded."""

from __future__ import annotations

import os
import random
import zlib
from pathlib import Path
from typing import Any

import msgpack

from memproto.frames import AlertRaised, Attached, Exited
from memproto.framing import frame_bytes
from memproto.recording import MAGIC, ZDICT, HeadroomSnapshot, PeakStack, SegmentHeader, SegmentWriter
from memproto.records import (
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
#: 2027-01-15 08:00:00 UTC.
T0 = 1_800_000_000.0
TICKS = 30
GOOD_PID, OTHER_PID = 7001, 7002
HOST = "damaged-box"


def _info(pid: int, start: float) -> ProcessInfo:
    return ProcessInfo(pid=pid, start_time=T0 - 100.0, name=f"p{pid}", cmdline=["python", f"job{pid}.py"],
                       label=f"job{pid}", uid=0, alive=True, attached_at=start, exited_at=None, rss_bytes=MiB,
                       rss_peak_bytes=MiB, anon_bytes=MiB, swap_bytes=0)


def _rss(sequence: int, i: int) -> int:
    return sequence * GiB if i == 10 else 100 * MiB + i * MiB


def segment(sequence: int) -> bytes:
    """Segment ``sequence`` (from 1) of a flight recorder: :data:`TICKS` samples a second
    from ``T0 + 100 * (sequence - 1)``; :data:`GOOD_PID` peaks at ``sequence`` GiB at tick
    10; :data:`OTHER_PID` exits at tick 20; an alert, headroom and a stack at the peak."""
    start = T0 + 100.0 * (sequence - 1)
    w = SegmentWriter(SegmentHeader(1, HOST, start, 1.0, [1, 6], "memagent test", "daemon", 42, 16 * GiB, sequence))
    out = bytearray(w.header_bytes())
    w.add(Attached(_info(GOOD_PID, start)))
    w.add(Attached(_info(OTHER_PID, start)))
    for i in range(TICKS):
        t = start + i
        peak = max(_rss(sequence, j) for j in range(i + 1))
        rows = [[GOOD_PID, T0 - 100.0, True, _rss(sequence, i), peak, _rss(sequence, i), 0, None, None, True, None],
                [OTHER_PID, T0 - 100.0, i < 20, 50 * MiB, 50 * MiB, 50 * MiB, 0, 10 * MiB, 10 * MiB, True, None]]
        w.add_sample(i, t, 1.0, rows, SAMPLE_COLUMNS)
        if i == 10:
            dump = StackDump(t, "peak", peak, None, [ThreadStack(1, "MainThread", True, True, [
                StackFrame("step", "/srv/job.py", 3)])], 1)
            w.add(PeakStack(GOOD_PID, T0 - 100.0, dump))
            w.add(HeadroomSnapshot(t, HostMemory(16 * GiB, 8 * GiB, 0, 0), [
                Headroom("host", "host memory", 16 * GiB, peak, peak / (16 * GiB), 16 * GiB, GiB, 0, True,
                         [Contributor(GOOD_PID, "job", peak)])]))
            w.add(AlertRaised(Alert(1, "headroom", "firing", "warning", "host", 0.9, 0.8, "near", t, [], "ratio")))
        if i == 20:
            w.add(Exited(OTHER_PID, T0 - 100.0, t, 50 * MiB))
        if i % 5 == 4:
            out += w.take()
    out += w.take()
    return bytes(out)


# ----------------------------------------------------------------------------- raw frames


def frames_of(data: bytes) -> tuple[bytes, list[list[Any]]]:
    """A well-formed segment as its header frame's bytes and its batches, each a list of
    unpacked msgpack bodies (to change and :func:`rebuild`)."""
    at = len(MAGIC)
    size = int.from_bytes(data[at:at + 4], "big")
    header = data[:at + 4 + size]
    at += 4 + size
    batches: list[list[Any]] = []
    while at < len(data):
        size = int.from_bytes(data[at:at + 4], "big")
        body = msgpack.unpackb(data[at + 4:at + 4 + size], raw=False)
        at += 4 + size
        raw = zlib.decompressobj(zdict=ZDICT).decompress(body["z"])
        inner, i = [], 0
        while i < len(raw):
            n = int.from_bytes(raw[i:i + 4], "big")
            inner.append(msgpack.unpackb(raw[i + 4:i + 4 + n], raw=False))
            i += 4 + n
        batches.append(inner)
    return header, batches


def batch(bodies: list[Any]) -> bytes:
    """Unpacked bodies as one framed batch, as the writer packs them."""
    deflater = zlib.compressobj(6, zdict=ZDICT)
    raw = b"".join(frame_bytes(msgpack.packb(b, use_bin_type=True)) for b in bodies)
    z = deflater.compress(raw) + deflater.flush()
    return frame_bytes(msgpack.packb({"t": "batch", "v": 1, "z": z}, use_bin_type=True))


def rebuild(header: bytes, batches: list[list[Any]]) -> bytes:
    return header + b"".join(batch(b) for b in batches)


# ----------------------------------------------------------------------------- damage

#: Values put in place of one value of a frame: not numbers, out of range, of the wrong type.
EVIL: list[Any] = [float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 1e19, -1, 0, 2**63, 2**64 - 1,
                   -(2**63), True, None, "x", "\x1b[2J\x07", b"\x00", [], {}, [1, 2], "a" * 300, 0.5]


def _slots(body: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) of an unpacked body, nested ones too."""
    out: list[tuple[Any, Any]] = []
    todo = [body]
    while todo:
        value = todo.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, inner in items:
            out.append((value, key))
            todo.append(inner)
    return out


def poison(data: bytes, rng: random.Random, value: Any = None, *, header_too: bool = False) -> bytes:
    """``data`` with one value of one frame replaced by ``value`` (else one of :data:`EVIL`)."""
    header, batches = frames_of(data)
    if header_too and rng.random() < 0.2:
        body = msgpack.unpackb(header[len(MAGIC) + 4:], raw=False)
        container, key = rng.choice(_slots(body))
        container[key] = value if value is not None else rng.choice(EVIL)
        header = MAGIC + frame_bytes(msgpack.packb(body, use_bin_type=True))
        return rebuild(header, batches)
    bodies = rng.choice(batches)
    body = rng.choice(bodies)
    container, key = rng.choice(_slots(body))
    container[key] = value if value is not None else rng.choice(EVIL)
    return rebuild(header, batches)


def flip_bytes(data: bytes, rng: random.Random) -> bytes:
    """``data`` with a few bytes changed, cut, or bytes put in, anywhere."""
    out = bytearray(data)
    kind = rng.randrange(4)
    if kind == 0:
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    elif kind == 1:
        del out[rng.randrange(len(out)):]
    elif kind == 2:
        at = rng.randrange(len(out))
        out[at:at] = rng.randbytes(rng.randint(1, 16))
    else:
        at = rng.randrange(len(out))
        del out[at:at + rng.randint(1, 64)]
    return bytes(out)


def mutations(n: int, seed: int) -> list[bytes]:
    """``n`` damaged copies of :func:`segment`\\ (1): half at the byte level, half at the
    value level (a NaN, an infinity, a wrong type in a decodable frame)."""
    rng = random.Random(seed)
    good = segment(1)
    return [flip_bytes(good, rng) if i % 2 else poison(good, rng, header_too=True) for i in range(n)]


def corrupt_batch(data: bytes, which: int) -> bytes:
    """``data`` with the zlib stream of batch ``which`` (from 0) zeroed past its start."""
    header, batches = frames_of(data)
    out = bytearray(header)
    for i, bodies in enumerate(batches):
        framed = batch(bodies)
        if i == which:
            body = msgpack.unpackb(framed[4:], raw=False)
            body["z"] = body["z"][:4] + bytes(len(body["z"]) - 4)
            framed = frame_bytes(msgpack.packb(body, use_bin_type=True))
        out += framed
    return bytes(out)


def nan_sample(data: bytes, tick: int) -> bytes:
    """``data`` with :data:`GOOD_PID`'s start time (the one float column of a row) NaN in
    the sample of ``tick``, and the time of the sample of ``tick + 1`` infinite."""
    header, batches = frames_of(data)
    for bodies in batches:
        for body in bodies:
            if body.get("t") == "sample" and body["seq"] == tick:
                body["rows"][0][1] = float("nan")
            if body.get("t") == "sample" and body["seq"] == tick + 1:
                body["time"] = float("inf")
    return rebuild(header, batches)


def damaged_directory(folder: Path) -> dict[str, str]:
    """A recorder directory: segments 1 and 3 good, segment 2 damaged in the middle (its
    batch 3 of 7 corrupt: ticks 0-9 read) and segment 4 with NaN and inf values (its tick 12
    loses GOOD_PID's row, tick 13 is dropped), and one damaged file or non-file per kind of
    damage. Returns the damaged names and the word their line says."""
    folder.mkdir(parents=True, exist_ok=True)
    good = [segment(n) for n in range(1, 5)]
    (folder / "seg-0001.mrec").write_bytes(good[0])
    (folder / "seg-0002.mrec").write_bytes(corrupt_batch(good[1], 2))
    (folder / "seg-0003.mrec").write_bytes(good[2])
    (folder / "seg-0004.mrec").write_bytes(nan_sample(good[3], 12))
    bad = {
        "seg-0005.mrec": "zero bytes",
        "seg-0006.mrec": "cut short or damaged",
        "seg-0007.mrec": "header is missing or cut short",
        "seg-0008.mrec": "a FIFO",
        "seg-0009.mrec": "a directory",
        "seg-0010.mrec": "a FIFO",
    }
    (folder / "seg-0005.mrec").write_bytes(b"")
    flipped = bytearray(segment(5))
    flipped[3] ^= 0x20  # MEMREC -> MEmREC
    (folder / "seg-0006.mrec").write_bytes(bytes(flipped))
    (folder / "seg-0007.mrec").write_bytes(segment(6)[:len(MAGIC) + 9])  # cut inside the header frame
    os.mkfifo(folder / "seg-0008.mrec")
    (folder / "seg-0009.mrec").mkdir()
    os.mkfifo(folder / "fifo")
    os.symlink("fifo", folder / "seg-0010.mrec")
    return bad


__all__ = ["GOOD_PID", "OTHER_PID", "T0", "TICKS", "corrupt_batch", "damaged_directory", "flip_bytes",
           "frames_of", "mutations", "nan_sample", "poison", "rebuild", "segment"]
