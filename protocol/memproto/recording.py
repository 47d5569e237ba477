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
import stat
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, ClassVar

import msgpack

from .codec import decode_body, encode, encode_sample, unpack
from .errors import DamagedSegment, NotARegularFile, ProtocolError, RecordingError
from .frames import AlertRaised, Attached, Detached, Exited, Frame, Sample
from .framing import frame_bytes
from .limits import HEADER_BYTES, MAX_FRAME_BYTES
from .records import SAMPLE_CHECKS, SAMPLE_COLUMNS, Headroom, HostMemory, StackDump
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
    #: The command a ``memagent run --record`` recording watched, as it was given (its title
    #: in ``plot`` and ``report``); nil for a daemon's or ``memagent record``'s recording.
    command: list[str] | None = None


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

    Damage ends the segment where it is found: what came before it is read, what comes
    after is not (a sample lists only the rows that changed, so the samples after a lost
    batch would show wrong values: missing is better than wrong). The damage is described
    in :attr:`damage` (one line): an incomplete last frame (a recorder killed while writing
    it), a length prefix that cannot be one, a batch that does not inflate, a frame that
    does not decode. A frame other than a sample holding NaN, an infinity or a time that
    cannot be is skipped and counted in :attr:`non_finite` (a sample's rows are
    :class:`Playback`'s to skip). A header
    that cannot be read: :class:`DamagedSegment`; a file that is no recording at all, or of
    a newer format: :class:`RecordingError`."""

    def __init__(self, stream: BinaryIO, name: str = "recording") -> None:
        self.stream = stream
        self.name = name
        self.damage: list[str] = []
        #: Frames skipped for a NaN, an infinity or an impossible time in them.
        self.non_finite = 0
        magic = stream.read(len(MAGIC))
        if not magic:
            raise DamagedSegment(f"{name}: zero bytes (a segment never written: a crash or a power loss)")
        if magic != MAGIC:
            if MAGIC.startswith(magic) or _near_magic(magic):
                raise DamagedSegment(f"{name}: the segment's first bytes are cut short or damaged")
            raise RecordingError(f"{name}: not a memagent recording")
        try:
            payload, _ = _read_frame(stream)
            header = decode_recorded(payload) if payload is not None else None
        except ProtocolError as exc:
            raise DamagedSegment(f"{name}: unreadable header: {exc}") from None
        if not isinstance(header, SegmentHeader):
            raise DamagedSegment(f"{name}: the header is missing or cut short")
        if not (_a_time(header.start_time) and math.isfinite(header.interval)):
            raise DamagedSegment(f"{name}: the header's start time or interval is not a number")
        if header.format > FORMAT_VERSION:
            raise RecordingError(f"{name}: recording format {header.format}; this memagent reads "
                                 f"format {FORMAT_VERSION} and older")
        self.header = header

    def __iter__(self) -> Iterator[Frame]:
        for _, _, frame in self.positioned():
            yield frame

    def positioned(self, offset: int | None = None, skip: int = 0) -> Iterator[tuple[int, int, Frame]]:
        """The frames with where each is: the byte offset of the outer frame holding it (a
        batch, or the frame itself) and its index among that frame's inner frames. Given
        an ``offset`` from an earlier reading of the same file, the reading resumes there,
        ``skip`` inner frames of that outer frame left out: a replay seeks without reading
        a segment again from its start (the rows of the samples before are the caller's
        to have kept: :meth:`Playback.copy`)."""
        if offset is not None:
            self.stream.seek(offset)
        while not self.damage:
            at = self.stream.tell()
            try:
                payload, partial = _read_frame(self.stream)
            except ProtocolError as exc:
                self.damage.append(f"{self.name}: stopped at byte {self.stream.tell()}: {exc}; the rest skipped")
                return
            if payload is None:
                if partial:
                    self.damage.append(f"{self.name}: the last {partial} bytes are an incomplete frame "
                                       "(written when the recorder stopped); skipped")
                return
            for index, frame in self._frames(payload, skip):
                yield at, index, frame
            skip = 0

    def _frames(self, payload: bytes, skip: int = 0) -> Iterator[tuple[int, Frame]]:
        try:
            body = unpack(payload)
            if type(body) is dict and body.get("t") == _BATCH:
                payloads: Sequence[bytes] = list(_unbatch(_inflate(body.get("z"))))
            else:
                payloads = [payload]
        except ProtocolError as exc:
            self.damage.append(f"{self.name}: a damaged batch: {exc}; the rest of the segment skipped")
            return
        for index in range(skip, len(payloads)):
            inner = payloads[index]
            try:
                frame = decode_recorded(inner)
                if not isinstance(frame, Sample) and not _plausible(frame, unpack(inner)):
                    self.non_finite += 1
                    continue
            except ProtocolError as exc:
                if exc.code == "unknown_request":  # a newer recorder's frame type: skipped quietly
                    continue
                self.damage.append(f"{self.name}: a frame that does not decode: {exc}; "
                                   "the rest of the segment skipped")
                return
            yield index, frame


def _near_magic(head: bytes) -> bool:
    """Whether ``head`` is :data:`MAGIC` with a few bytes damaged (a segment of ours with
    a flipped byte, not another kind of file)."""
    return len(head) == len(MAGIC) and sum(a != b for a, b in zip(head, MAGIC, strict=True)) <= 3


def _all_finite(body: object) -> bool:
    """Whether every float in an unpacked frame is a number (no NaN, no infinity). Walked
    with a list, not recursion: msgpack nests deeper than Python recurses."""
    todo = [body]
    while todo:
        value = todo.pop()
        if type(value) is float:
            if not math.isfinite(value):
                return False
        elif type(value) is list:
            todo.extend(value)
        elif type(value) is dict:
            todo.extend(value.values())
    return True


#: The last second of the year 9999 UTC: a time after it (or before 1970) is no time a
#: recording was made at, and no clock or date function of the readers takes it.
LATEST_TIME = 253_402_300_799.0


def _a_time(t: float) -> bool:
    """Whether ``t`` can be the time of a recorded frame."""
    return 0.0 <= t <= LATEST_TIME  # False for NaN too


#: Largest count a recorded row may hold (a byte count, a PID): a signed 64-bit one.
LARGEST_COUNT = 2**63 - 1


def _row_checks(fields: Sequence[str]) -> tuple[list[int], list[int]]:
    """The columns of a sample that hold a time (a row's ``start_time``) and those that
    hold a count (bytes, a PID: ints, nil where allowed), the types of the known columns
    being :meth:`Sample.validate`'s to check."""
    times = [i for i, name in enumerate(fields) if name == "start_time"]
    counts = [i for i, name in enumerate(fields) if name in SAMPLE_CHECKS and name != "start_time"
              and _is_count(SAMPLE_CHECKS[name])]
    return times, counts


def _is_count(kind: type | tuple[type, ...]) -> bool:
    return int in kind if isinstance(kind, tuple) else kind is int


def _row_ok(row: Sequence[Any], times: Sequence[int], counts: Sequence[int]) -> bool:
    """Whether a row's values can be true: its times are times, its counts 0 or more."""
    for i in times:  # loops, not all(): called for every row read
        if not 0.0 <= row[i] <= LATEST_TIME:  # False for NaN too
            return False
    for i in counts:
        value = row[i]
        if value is not None and not 0 <= value <= LARGEST_COUNT:
            return False
    return True


def _frame_times(frame: Frame) -> list[float | None]:
    """The times a frame other than a sample carries (checked by :func:`_a_time`)."""
    if isinstance(frame, (Exited, HeadroomSnapshot)):
        return [frame.time]
    if isinstance(frame, AlertRaised):
        return [frame.alert.time]
    if isinstance(frame, PeakStack):
        return [frame.dump.time, frame.start_time]
    if isinstance(frame, Attached):
        p = frame.process
        return [p.start_time, p.attached_at, p.exited_at, p.peak_since]
    return []


def _plausible(frame: Frame, body: object) -> bool:
    """Whether a frame other than a sample holds only numbers (no NaN, no infinity) and
    only times that can be."""
    return _all_finite(body) and all(t is None or _a_time(t) for t in _frame_times(frame))


class Playback:
    """Turns a recording's frames back into what a subscriber saw: every ``sample`` with a
    row for every process (changed or not), the processes known from ``attached``.

    A row with a value that cannot be (NaN, an infinity, a start time before 1970 or after
    the year 9999, :data:`LATEST_TIME`; a negative count) is not kept: its process has no
    row until its next good one (missing, not wrong). A sample whose time cannot be, or
    whose interval is not a number, is taken in (the rows after it are written against
    it) but not given out. Both are counted in :attr:`non_finite`."""

    def __init__(self) -> None:
        self.header: SegmentHeader | None = None
        self.rows: dict[tuple[Any, Any], list[Any]] = {}
        self._fields: tuple[str, ...] | None = None
        self._checks: tuple[list[int], list[int]] = ([], [])
        #: Rows and samples skipped for a value in them that cannot be.
        self.non_finite = 0

    def copy(self) -> Playback:
        """Another playback that goes on from where this one is (a replay's checkpoint: the
        rows are never changed in place, so the map of them is copied, not each row)."""
        other = Playback()
        other.header, other.rows = self.header, dict(self.rows)
        other._fields, other._checks = self._fields, self._checks
        return other

    def feed(self, frame: Frame) -> Frame | None:
        """The frame as a subscriber had it; None for a sample that is not given out."""
        if isinstance(frame, SegmentHeader):
            self.header, self.rows, self._fields = frame, {}, None
        elif isinstance(frame, Sample):
            return self._sample(frame)
        elif isinstance(frame, Detached):
            self.rows.pop((frame.pid, frame.start_time), None)
        return frame  # an attached process's row comes with the next sample

    def _sample(self, frame: Sample) -> Sample | None:
        fields = tuple(frame.fields)
        if fields != self._fields:
            self.rows, self._fields = {}, fields
            self._checks = _row_checks(fields)
        key = _row_key(fields)
        times, counts = self._checks
        for row in frame.rows:
            if _row_ok(row, times, counts):
                self.rows[key(row)] = row
            else:
                self.non_finite += 1
                self._forget(row, fields)
        if not (_a_time(frame.time) and math.isfinite(frame.interval)):
            self.non_finite += 1
            return None
        return Sample(frame.seq, frame.time, frame.interval, list(fields), list(self.rows.values()))

    def _forget(self, row: Sequence[Any], fields: Sequence[str]) -> None:
        """The process of a bad row has no row until its next good one: by its key, or
        every process of its PID when the start time is the bad value (no key matches)."""
        pid = row[fields.index("pid")]
        if self.rows.pop(_row_key(fields)(row), None) is None:
            for k in [k for k in self.rows if k[0] == pid]:
                del self.rows[k]


def segment_files(path: str) -> list[str]:
    """The segments of a recording at ``path``: the file itself, or a directory's ``*.mrec``
    files in the order they were written (their names sort so). Whether each is a regular
    file is :func:`open_segment`'s to say."""
    if os.path.isdir(path):
        return [os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(SUFFIX)]
    return [path]


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def open_segment(path: str) -> BinaryIO:
    """``path`` opened for reading, if it is a regular file (through a link or not):
    :class:`NotARegularFile` for a FIFO, a device, a directory or a socket, which is never
    opened for reading (a FIFO would hang the reader). ``O_NONBLOCK`` and a look at what was
    opened close the race of a file swapped for a FIFO between the look and the open.
    ``OSError`` as raised."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotARegularFile(f"{path}: {_kind(mode)}, not a regular file (not opened)")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFile(f"{path}: {_kind(mode)}, not a regular file (not opened)")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _why_skipped(name: str, exc: Exception) -> str:
    """The line for a segment of a directory that is skipped."""
    if isinstance(exc, RecordingError):
        return f"{exc}; segment skipped"
    if isinstance(exc, OSError):
        return f"{name}: cannot read it: {exc.strerror or exc}; segment skipped"
    return f"{name}: {exc}; segment skipped"


def _headers(paths: Sequence[str], on_damage: Callable[[str], None]) -> list[tuple[str, SegmentHeader]]:
    """The header of every segment at ``paths``, a listed one that cannot be read skipped
    with a line (a file named is read or raises). :class:`RecordingError` when a directory's
    segments are all unreadable."""
    headers: list[tuple[str, SegmentHeader]] = []
    for path in paths:
        names = segment_files(path)
        skipped = 0
        for name in names:
            listed = name != path
            try:
                with open_segment(name) as stream:
                    headers.append((name, SegmentReader(stream, name).header))
            except FileNotFoundError:
                if not listed:  # else a segment the recorder dropped since the directory was listed
                    raise
            except (RecordingError, OSError) as exc:
                if not listed:
                    raise
                skipped += 1
                on_damage(_why_skipped(name, exc))
        if skipped and skipped == len(names):
            raise RecordingError(f"{path}: none of its {skipped} segments can be read")
    return headers


def recording_segments(paths: Sequence[str], *, since: float | None = None, until: float | None = None,
                       on_damage: Callable[[str], None] | None = None) -> list[tuple[str, SegmentHeader]]:
    """The segments at ``paths`` (files or directories) in the order they were written, each
    with its header: those that end before ``since`` (the next one begins before it) or
    begin after ``until`` left out. What cannot be read is as :func:`open_recording` says."""
    headers = _headers(paths, on_damage if on_damage is not None else (lambda line: None))
    headers.sort(key=lambda nh: (nh[1].start_time, nh[1].sequence))
    kept = []
    for i, (name, header) in enumerate(headers):
        following = headers[i + 1][1].start_time if i + 1 < len(headers) else None
        if since is not None and following is not None and following <= since:
            continue
        if until is not None and header.start_time > until:
            break
        kept.append((name, header))
    return kept


def open_recording(paths: Sequence[str], *, since: float | None = None, until: float | None = None,
                   on_damage: Callable[[str], None] | None = None) -> Iterator[Frame]:
    """Every frame of the segments at ``paths`` (files or directories), each segment's
    header first and its samples whole (:class:`Playback`). Segments that end before
    ``since`` (the next one begins before it) or begin after ``until`` are not opened.

    A directory's segment that cannot be read (zero bytes, a damaged header, not a regular
    file, not readable) is skipped, told to ``on_damage`` in one line, and the others read;
    the damage inside a segment is told there too (:class:`SegmentReader`), and the count
    of values that are NaN or infinite, one line a segment. A file named in ``paths``
    that cannot be read: :class:`RecordingError` (:class:`DamagedSegment`,
    :class:`NotARegularFile`) or ``OSError``, as is a directory of which no segment reads."""
    segments = recording_segments(paths, since=since, until=until, on_damage=on_damage)
    for *_, frame in played_frames(segments, Playback(), on_damage=on_damage):
        yield frame


def played_frames(segments: Sequence[tuple[str, SegmentHeader]], playback: Playback, *, segment: int = 0,
                  offset: int | None = None, skip: int = 0,
                  on_damage: Callable[[str], None] | None = None) -> Iterator[tuple[int, int, int, Frame]]:
    """The frames of ``segments`` (:func:`recording_segments`) through ``playback``, each
    with where it is: the index of its segment, the byte offset of its outer frame and its
    index there (:meth:`SegmentReader.positioned`; a segment's header: offset 0, index -1).
    From ``segments[segment]`` on; with ``offset``, that segment is resumed there, ``skip``
    inner frames left out, ``playback`` as it was after the frame before (a replay's seek).
    A segment dropped or replaced since its header was read is skipped (told unless gone)."""
    tell = on_damage if on_damage is not None else (lambda line: None)
    for i in range(segment, len(segments)):
        name = segments[i][0]
        try:
            stream = open_segment(name)  # closed below (with)
        except (RecordingError, OSError) as exc:  # dropped or replaced since its header was read
            if not isinstance(exc, FileNotFoundError):
                tell(_why_skipped(name, exc))
            continue
        with stream:
            try:
                reader = SegmentReader(stream, name)
            except RecordingError as exc:
                tell(_why_skipped(name, exc))
                continue
            resumed = i == segment and offset is not None
            before = playback.non_finite
            if not resumed:
                yield i, 0, -1, playback.feed(reader.header)  # type: ignore[misc]  # a header is given out
            for at, index, frame in reader.positioned(offset if resumed else None, skip if resumed else 0):
                played = playback.feed(frame)
                if played is not None:
                    yield i, at, index, played
            for line in reader.damage:
                tell(line)
            skipped = reader.non_finite + playback.non_finite - before
            if skipped:
                tell(f"{reader.name}: {skipped} rows or frames skipped for values that cannot be "
                     "(NaN, infinite, out of range)")


__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_BATCH_BYTES",
    "RECORDING_TYPES",
    "SUFFIX",
    "DamagedSegment",
    "HeadroomSnapshot",
    "NotARegularFile",
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
    "open_segment",
    "pack_batch",
    "played_frames",
    "recording_segments",
    "segment_files",
]
