"""The recording format (``docs/recording.md``): the protocol's own frames, kept in files.

A recording is one or more *segments*. A segment is a file that starts with
:data:`MAGIC`, then a framed :class:`SegmentHeader`, then framed frames exactly as on the
wire (§3 of ``docs/protocol.md``), most of them packed, a second's worth at a time, into
``batch`` frames whose ``z`` is the zlib stream of the frames it holds. Two rules differ
from the wire, both so that an idle process costs almost nothing:

* a ``sample`` lists only the rows that changed since the previous ``sample`` of the same
  segment; a process with no row kept its values. The first ``sample`` after the header
  lists every row (a segment reads on its own, and the oldest can be dropped);
* a segment opens with what a client would have asked ``list`` for: an ``attached`` frame
  per process watched when it began, then its ``headroom`` and ``peak_stack`` frames.

A writer refuses a frame or a row holding a non-finite number (NaN, ±inf): it is not
written and :attr:`SegmentWriter.refused` counts it (a missing value, never a wrong one).
A ``thinned`` frame says how many of one user's processes were left out (the daemon's
per-user share of its recorder: docs/recording.md); a reader that does not know it skips it.

This module is pure: it encodes into bytes and decodes from a binary stream someone else
opened (:func:`open_recording` is the one convenience that opens files).
"""

from __future__ import annotations

import math
import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, ClassVar

import msgpack

from .codec import decode_body, encode, encode_sample, unpack
from .errors import ProtocolError, RecordingError
from .frames import Detached, Frame, Sample
from .framing import frame_bytes
from .limits import HEADER_BYTES, MAX_FRAME_BYTES
from .records import SAMPLE_COLUMNS, Headroom, HostMemory, StackDump
from .schema import from_wire, to_wire, wire
from .version import PROTOCOL_MAJOR

#: First bytes of every segment (as PNG's: a high byte, a name, CR LF, ^Z, LF catch a file
#: mangled as text).
MAGIC = b"\x89MEMREC\r\n\x1a\n"
#: The segment format this module writes; a reader refuses a newer one in one line.
FORMAT_VERSION = 1
#: File name suffix of a segment.
SUFFIX = ".mrec"
#: The preset dictionary of every batch's zlib stream (format 1; never changed within a
#: format): the words every frame repeats, so that a batch of one or two samples costs
#: its values, not its keys.
ZDICT = msgpack.packb([
    "t", "v", "seq", "time", "interval", "fields", "rows", "sample", "attached", "exited", "detached",
    "stack_state", "alert", "process", "pid", "start_time", "alive", "rss_bytes", "rss_peak_bytes",
    "anon_bytes", "swap_bytes", "vram_bytes", "vram_peak_bytes", "rss_peak_exact", "name", "cmdline",
    "label", "uid", "attached_at", "exited_at", "peak_since", "vram_peak_exact", "gpus", "headroom",
    "host", "total_bytes", "available_bytes", "capacity_bytes", "sum_peaks_bytes", "peak_stack",
], use_bin_type=True) + msgpack.packb((  # the v1.5 sample columns, frozen here
    "pid", "start_time", "alive", "rss_bytes", "rss_peak_bytes", "anon_bytes", "swap_bytes", "vram_bytes",
    "vram_peak_bytes", "rss_peak_exact"), use_bin_type=True)
#: Largest decompressed batch a reader accepts (a batch is about a second of frames).
MAX_BATCH_BYTES = 64 * 1024 * 1024


@wire
@dataclass(frozen=True, slots=True)
class SegmentHeader(Frame):
    """The first frame of every segment."""

    TYPE: ClassVar[str] = "recording"
    format: int
    #: The recording host's name.
    host: str
    #: When the segment began, Unix seconds.
    start_time: float
    #: The daemon's sample interval, seconds.
    interval: float
    #: The protocol version of the frames that follow, ``[major, minor]``.
    version: list[int]
    software: str
    #: "daemon" (its flight recorder) or "client" (``memagent record``).
    source: str = "daemon"
    #: The daemon's PID.
    pid: int | None = None
    #: The host's RAM, for a capacity line.
    mem_total_bytes: int | None = None
    #: The segment's number in its recorder's sequence, from 1 (0: a client's recording).
    sequence: int = 0


@wire
@dataclass(frozen=True, slots=True)
class PeakStack(Frame):
    """The Python stack taken when a process reached its peak (``stack_ok.at_peak``)."""

    TYPE: ClassVar[str] = "peak_stack"
    pid: int
    start_time: float
    dump: StackDump


@wire
@dataclass(frozen=True, slots=True)
class HeadroomSnapshot(Frame):
    """The host's memory and the headroom (``status.host``, ``status.headroom``) at ``time``."""

    TYPE: ClassVar[str] = "headroom"
    time: float
    host: HostMemory
    headroom: list[Headroom]


@wire
@dataclass(frozen=True, slots=True)
class Thinned(Frame):
    """Processes of one user left out of the recording since the previous ``thinned`` of
    that user (the user's share of the recorder was used; docs/recording.md): they lived
    less than the recorder's hold time, and none of their frames (attach, rows, exit,
    detach, stacks) was written."""

    TYPE: ClassVar[str] = "thinned"
    time: float
    #: The processes' real UID.
    uid: int
    #: How many processes were left out.
    processes: int


#: Frame types only recordings carry; the rest are the wire's.
RECORDING_TYPES: dict[str, type[Frame]] = {
    cls.TYPE: cls for cls in (SegmentHeader, PeakStack, HeadroomSnapshot, Thinned)}
_BATCH = "batch"


def decode_recorded(payload: bytes) -> Frame:
    """A frame of a recording: a wire frame or one of :data:`RECORDING_TYPES`.
    :class:`ProtocolError` (or its ``UnknownFrameType``) when it is not one."""
    body = unpack(payload)
    tag = body.get("t") if type(body) is dict else None
    cls = RECORDING_TYPES.get(tag) if type(tag) is str else None
    if cls is None:
        return decode_body(body)
    frame = from_wire(cls, body)
    frame.validate()
    return frame


# ----------------------------------------------------------------------------- writing


def finite(value: object) -> bool:
    """Whether every number in ``value`` (a frame's wire form: dicts, lists, scalars) is finite."""
    if type(value) is float:
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(finite(v) for v in value)
    return True


def _row_finite(values: tuple[Any, ...]) -> bool:
    isfinite = math.isfinite
    return all(type(v) is not float or isfinite(v) for v in values)


def _row_key(fields: Sequence[str]) -> Callable[[Sequence[Any]], tuple[Any, Any]]:
    pid, start = fields.index("pid"), fields.index("start_time")
    return lambda row: (row[pid], row[start])


class SegmentWriter:
    """Encodes one segment. Frames are queued in memory (:meth:`add`, :meth:`add_sample`)
    and leave as one compressed ``batch`` per :meth:`take` — the caller writes the bytes
    where and when it likes (the daemon: off its tick, in a thread). Not thread-safe."""

    def __init__(self, header: SegmentHeader, *, level: int = 6) -> None:
        self.header = header
        self.level = level
        self._pending = bytearray()
        self._frames = 0
        self._last: dict[tuple[Any, Any], tuple[Any, ...]] = {}
        self._fields: tuple[str, ...] | None = None
        #: Frames and rows refused because they held a non-finite number (never written).
        self.refused = 0

    def header_bytes(self) -> bytes:
        return MAGIC + frame_bytes(encode(self.header))

    def add(self, frame: Frame) -> int:
        """Queue ``frame``; its encoded size, or 0 when refused (a non-finite number in it)."""
        if not finite(to_wire(frame)):
            self.refused += 1
            return 0
        payload = encode(frame)
        self.add_encoded(payload)
        if isinstance(frame, Detached):
            self._last.pop((frame.pid, frame.start_time), None)
        return len(payload)

    def add_encoded(self, payload: bytes) -> None:
        """An already encoded frame (the daemon encodes its events once for every sink)."""
        self._pending += frame_bytes(payload)
        self._frames += 1

    def add_sample(self, seq: int, time: float, interval: float, rows: Sequence[Sequence[Any]],
                   fields: Sequence[str] = SAMPLE_COLUMNS) -> int:
        """A tick's sample, written with only the rows that changed; returns how many. A row
        with a non-finite number is refused (counted in :attr:`refused`): its process keeps
        its previous values in the recording."""
        if not (math.isfinite(time) and math.isfinite(interval)):
            self.refused += 1
            return 0
        fields = tuple(fields)
        if fields != self._fields:  # a new set of columns: every row counts as changed
            self._fields, self._last = fields, {}
        key = _row_key(fields)
        changed = []
        for row in rows:
            values = tuple(row)
            k = key(values)
            if self._last.get(k) != values:
                if not _row_finite(values):
                    self.refused += 1
                    continue
                self._last[k] = values
                changed.append(values)
        self.add_encoded(encode_sample(seq, time, interval, changed, fields))
        return len(changed)

    @property
    def pending_bytes(self) -> int:
        return len(self._pending)

    @property
    def pending_frames(self) -> int:
        return self._frames

    def take(self) -> bytes:
        """The queued frames as one framed ``batch`` (``b""`` when none are queued)."""
        return pack_batch(self.take_raw(), self.level)

    def take_raw(self) -> bytes:
        """The queued frames, framed but not yet packed (:func:`pack_batch` does that, in
        another thread if the caller likes: compressing a second of a big fleet takes ms)."""
        raw, self._pending, self._frames = bytes(self._pending), bytearray(), 0
        return raw

    def drop_pending(self) -> int:
        """Forget the queued frames (the disk is full); returns how many there were. The
        next sample lists every row again, so what follows still reads right."""
        n = self._frames
        self._pending.clear()
        self._frames = 0
        self._last = {}
        return n


def pack_batch(raw: bytes, level: int = 6) -> bytes:
    """Framed frames (:meth:`SegmentWriter.take_raw`) as one framed ``batch``; ``b""`` for none."""
    if not raw:
        return b""
    deflater = zlib.compressobj(level, zdict=ZDICT)
    data = deflater.compress(raw) + deflater.flush()
    return frame_bytes(msgpack.packb({"t": _BATCH, "v": PROTOCOL_MAJOR, "z": data}, use_bin_type=True))


# ----------------------------------------------------------------------------- reading


def _read_frame(stream: BinaryIO) -> tuple[bytes | None, int]:
    """The next payload, or ``None`` at the end; with the count of bytes of an incomplete
    frame found instead (the tail a recorder was writing when it stopped)."""
    head = stream.read(HEADER_BYTES)
    if not head:
        return None, 0
    if len(head) < HEADER_BYTES:
        return None, len(head)
    size = int.from_bytes(head, "big")
    if size == 0 or size > MAX_FRAME_BYTES:
        raise ProtocolError(f"a frame length of {size} bytes")
    payload = stream.read(size)
    if len(payload) < size:
        return None, HEADER_BYTES + len(payload)
    return payload, 0


def _unbatch(data: bytes) -> Iterator[bytes]:
    """The framed payloads inside a decompressed batch."""
    at = 0
    while at < len(data):
        if len(data) - at < HEADER_BYTES:
            raise ProtocolError("a batch ends inside a frame's length")
        size = int.from_bytes(data[at:at + HEADER_BYTES], "big")
        at += HEADER_BYTES
        if size == 0 or at + size > len(data):
            raise ProtocolError("a batch ends inside a frame")
        yield data[at:at + size]
        at += size


def _inflate(z: object) -> bytes:
    if type(z) is not bytes:
        raise ProtocolError("batch.z: expected bin")
    inflater = zlib.decompressobj(zdict=ZDICT)
    try:
        data = inflater.decompress(z, MAX_BATCH_BYTES)
    except zlib.error as exc:
        raise ProtocolError(f"batch.z: not a zlib stream ({exc})") from None
    if inflater.unconsumed_tail:
        raise ProtocolError(f"batch.z: more than {MAX_BATCH_BYTES} bytes once inflated")
    if not inflater.eof:
        raise ProtocolError("batch.z: the zlib stream is cut short")
    return data


class SegmentReader:
    """Reads one segment from a binary stream: :attr:`header` at once, the frames as
    iterated (batches opened, the wire's rules for samples left to :class:`Playback`).

    A damaged part does not stop the reading: an incomplete last frame (a recorder killed
    while writing it) or a batch that does not decode is skipped and described in
    :attr:`damage`, and the frames after it are read. Only a length prefix that cannot be
    one (the stream is out of step) ends the segment early, described too."""

    def __init__(self, stream: BinaryIO, name: str = "recording") -> None:
        self.stream = stream
        self.name = name
        self.damage: list[str] = []
        if stream.read(len(MAGIC)) != MAGIC:
            raise RecordingError(f"{name}: not a memagent recording")
        try:
            payload, _ = _read_frame(stream)
            header = decode_recorded(payload) if payload is not None else None
        except ProtocolError as exc:
            raise RecordingError(f"{name}: unreadable header: {exc}") from None
        if not isinstance(header, SegmentHeader):
            raise RecordingError(f"{name}: the header is missing or cut short")
        if header.format > FORMAT_VERSION:
            raise RecordingError(f"{name}: recording format {header.format}; this memagent reads "
                                 f"format {FORMAT_VERSION} and older")
        self.header = header

    def __iter__(self) -> Iterator[Frame]:
        while True:
            try:
                payload, partial = _read_frame(self.stream)
            except ProtocolError as exc:
                self.damage.append(f"{self.name}: stopped at byte {self.stream.tell()}: {exc}")
                return
            if payload is None:
                if partial:
                    self.damage.append(f"{self.name}: the last {partial} bytes are an incomplete frame "
                                       "(written when the recorder stopped); skipped")
                return
            yield from self._frames(payload)

    def _frames(self, payload: bytes) -> Iterator[Frame]:
        try:
            body = unpack(payload)
            if type(body) is dict and body.get("t") == _BATCH:
                payloads: Iterable[bytes] = list(_unbatch(_inflate(body.get("z"))))
            else:
                payloads = [payload]
        except ProtocolError as exc:
            self.damage.append(f"{self.name}: a damaged batch skipped: {exc}")
            return
        for inner in payloads:
            try:
                yield decode_recorded(inner)
            except ProtocolError as exc:
                if exc.code != "unknown_request":  # a newer recorder's frame type: skipped quietly
                    self.damage.append(f"{self.name}: a frame skipped: {exc}")


class Playback:
    """Turns a recording's frames back into what a subscriber saw: every ``sample`` with a
    row for every process (changed or not), the processes known from ``attached``."""

    def __init__(self) -> None:
        self.header: SegmentHeader | None = None
        self.rows: dict[tuple[Any, Any], list[Any]] = {}
        self._fields: tuple[str, ...] | None = None

    def feed(self, frame: Frame) -> Frame:
        if isinstance(frame, SegmentHeader):
            self.header, self.rows, self._fields = frame, {}, None
        elif isinstance(frame, Sample):
            fields = tuple(frame.fields)
            if fields != self._fields:
                self.rows, self._fields = {}, fields
            key = _row_key(fields)
            for row in frame.rows:
                self.rows[key(row)] = row
            return Sample(frame.seq, frame.time, frame.interval, list(fields), list(self.rows.values()))
        elif isinstance(frame, Detached):
            self.rows.pop((frame.pid, frame.start_time), None)
        return frame  # an attached process's row comes with the next sample


def segment_files(path: str) -> list[str]:
    """The segments of a recording at ``path``: the file itself, or a directory's ``*.mrec``
    files in the order they were written (their names sort so)."""
    if os.path.isdir(path):
        return [os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(SUFFIX)]
    return [path]


def open_recording(paths: Sequence[str], *, since: float | None = None, until: float | None = None,
                   on_damage: Callable[[str], None] | None = None) -> Iterator[Frame]:
    """Every frame of the segments at ``paths`` (files or directories), each segment's
    header first and its samples whole (:class:`Playback`). Segments that end before
    ``since`` (the next one begins before it) or begin after ``until`` are not opened.
    :class:`RecordingError` for a file that is not a recording; ``OSError`` as raised."""
    headers: list[tuple[str, SegmentHeader]] = []
    for name, listed in ((f, f != p) for p in paths for f in segment_files(p)):
        try:
            with open(name, "rb") as stream:
                headers.append((name, SegmentReader(stream, name).header))
        except FileNotFoundError:
            if not listed:  # else a segment the recorder dropped since the directory was listed
                raise
    headers.sort(key=lambda nh: (nh[1].start_time, nh[1].sequence))
    playback = Playback()
    for i, (name, header) in enumerate(headers):
        following = headers[i + 1][1].start_time if i + 1 < len(headers) else None
        if since is not None and following is not None and following <= since:
            continue
        if until is not None and header.start_time > until:
            break
        try:
            stream = open(name, "rb")  # closed below (with); a segment dropped meanwhile is skipped
        except FileNotFoundError:
            continue
        with stream:
            reader = SegmentReader(stream, name)
            yield playback.feed(reader.header)
            for frame in reader:
                yield playback.feed(frame)
            if on_damage is not None:
                for line in reader.damage:
                    on_damage(line)


__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_BATCH_BYTES",
    "RECORDING_TYPES",
    "SUFFIX",
    "HeadroomSnapshot",
    "PeakStack",
    "Playback",
    "RecordingError",
    "SegmentHeader",
    "SegmentReader",
    "SegmentWriter",
    "Thinned",
    "decode_recorded",
    "finite",
    "open_recording",
    "pack_batch",
    "segment_files",
]
