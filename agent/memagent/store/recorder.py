"""The flight recorder: the daemon's sample stream and events, appended to segment files
in ``<state_dir>/record`` (the format: :mod:`memproto.recording`, docs/recording.md).

Off the tick. The tick only queues frames in memory (:meth:`FlightRecorder.sample`, the
event methods: a ``SegmentWriter.add*``, microseconds); once a second :meth:`flush` takes
what is queued and hands it to the recorder's one I/O thread, which compresses it into a
``batch`` frame and appends it with one ``write``. The thread runs the recorder's file
operations one at a time in the order given (:mod:`memagent.store.record_files`), so a
write, a rotation and the close at shutdown never interleave, whatever the event loop does.

Bounded. A segment ends at ``[record] segment_bytes`` (derived from ``max_bytes``) or after
an hour; then the oldest segments are dropped until the others and the new one's room fit
in ``max_bytes``. What waits to be written is bounded too (:data:`MAX_PENDING`): past it
(a disk that does not keep up) the queued frames are dropped and counted, and the next
sample lists every row again, so what is on disk still reads right.

A SIGKILL at any moment leaves each segment readable: at most its last batch cut short,
which the reader reports and skips. A write that fails (a full disk: ENOSPC, EDQUOT,
EFBIG; EROFS, EIO) cuts the segment back to its last whole frame and *pauses* recording:
one warning line, ``status`` says "paused" and why, sampling and serving go on; every
``retry_interval`` a new segment (with its keyframe) is tried, and the first that works
is one info line and recording "on" again. Before pausing, a full disk frees the
recorder's own oldest segments (:mod:`memagent.store.record_files`).

Shared. Each real UID's processes may hold a share of the recording
(:mod:`memagent.store.record_share`): past it, that user's short-lived processes are left
out and counted in a ``thinned`` frame, so one user's churn does not turn over everyone's
history. A frame or row holding a non-finite number is refused when written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TypeVar

from memproto.frames import AlertRaised, Attached, Detached, Exited, Frame, StackStateChanged
from memproto.recording import FORMAT_VERSION, HeadroomSnapshot, PeakStack, SegmentHeader, SegmentWriter, Thinned
from memproto.records import Alert, Headroom, ProcessInfo, StackDump
from memproto.text import cut_cmdline
from memproto.version import PROTOCOL_VERSION

from .. import SOFTWARE
from ..alerting.engine import AlertEngine
from ..alerting.headroom import host_memory
from ..config import MiB, RecordConfig, copy_live
from ..core.registry import Registry
from ..core.stack_collector import StackCollector
from ..core.watched import Watched
from ..errors import RecordDirRefused
from ..proc.procfs import ProcFS
from .record_files import NAME, RecordFiles
from .record_share import UserShares
from .state import StateDir

log = logging.getLogger(__name__)

ON, PAUSED, OFF = "on", "paused", "off"
#: Seconds between two batches written.
FLUSH_EVERY = 1.0
#: A segment is closed after this long even when small (a reader can skip whole hours).
SEGMENT_SECONDS = 3600.0
#: A headroom snapshot at least this often, and at most once a second when it moves.
HEADROOM_EVERY = 10.0
#: Bytes of frames waiting for the disk, at most (about 25 s of 1000 busy processes at 10 Hz).
MAX_PENDING = 16 * MiB
#: A keyframe's copy of an exited process's command line: this many characters at most,
#: each argument at most KEYFRAME_ARG (the whole one is in its ``attached`` frame).
KEYFRAME_CMDLINE = 256
KEYFRAME_ARG = 64
#: zlib level of the batches (6: the default; 9 saves ~3 % for twice the CPU).
LEVEL = 6

T = TypeVar("T")


def _keyframe_info(w: Watched) -> ProcessInfo:
    """A process as a keyframe lists it. An exited one's command line is cut to
    :data:`KEYFRAME_CMDLINE` characters: it was written whole in its ``attached`` frame,
    and repeating up to 8 KiB for each of 256 exited entries in every segment made one
    user's churn of long command lines most of a recording (readers keep the whole one
    they have read: :func:`memproto.text.fuller_cmdline`)."""
    info = w.info()
    if info.alive:
        return info
    return replace(info, cmdline=cut_cmdline(info.cmdline, KEYFRAME_CMDLINE, KEYFRAME_ARG))


#: What of a headroom view :func:`_moved` compares: its resource, capacity, Σ peaks, total
#: now and observed maximum.
Mark = tuple[str, int, int, int, int]


def _marks(views: list[Headroom]) -> list[Mark]:
    """What of the headroom :func:`_moved` compares, per view."""
    return [(h.resource, h.capacity_bytes, h.sum_peaks_bytes, h.sum_now_bytes or 0, h.observed_sum_max_bytes or 0)
            for h in views]


def _moved(old: list[Mark], new: list[Mark]) -> bool:
    """Whether the headroom changed enough to be worth a snapshot: another set of resources,
    a new observed maximum (so that a recording holds each one the daemon reached, with its
    moment: :func:`memagent.alerting.observed.moments_of`), or a capacity, a Σ of peaks or a
    total now moved by 1 % of the capacity (at least 1 MiB). A derived capacity follows
    what unwatched processes use: it moves by bytes at every reading."""
    if [m[0] for m in old] != [m[0] for m in new]:
        return True
    return any(o0 != o1 or max(abs(c0 - c1), abs(s0 - s1), abs(n0 - n1)) >= max(MiB, c1 // 100)
               for (_, c0, s0, n0, o0), (_, c1, s1, n1, o1) in zip(old, new, strict=True))


class FlightRecorder:
    """What the daemon records, and the state the status reports (``recording``, its note)."""

    def __init__(self, config: RecordConfig, state: StateDir | None, interval: float, *, registry: Registry,
                 stacks: StackCollector, alerts: AlertEngine, procfs: ProcFS) -> None:
        self.config = config
        self.state_dir = state
        self.interval = interval
        self.registry = registry
        self.stacks = stacks
        self.alerts = alerts
        self.procfs = procfs
        self.state = OFF
        self._off_note: str | None = None
        if not config.enabled:
            self._off_note = "disabled (--no-record, or [record] enabled = false)"
        elif state is None:
            self._off_note = "no state directory (state_dir = \"\", or a daemon on another socket than the default)"
        self.files: RecordFiles | None = None
        self.writer: SegmentWriter | None = None
        #: Frames dropped because the disk did not keep up (not counting a pause).
        self.dropped_frames = 0
        self._io: ThreadPoolExecutor | None = None
        self._stop = asyncio.Event()
        self._prev_rows: Sequence[object] | None = None
        self._started = 0.0
        self._paused_since = 0.0
        self._paused_why = ""
        self._retry_at = 0.0
        self._max_bytes = config.max_bytes
        self._hr_seen: list[Headroom] | None = None
        self._hr_marks: list[Mark] = []
        self._hr_at = float("-inf")
        self.shares = UserShares()
        self._refused_told = False
        self._freed_told = 0

    # ------------------------------------------------------------------ status

    def apply(self, config: RecordConfig) -> None:
        """A reload: the live keys of ``[record]`` into the running config (the sizes and
        the retry period, read at each use); ``enabled`` stays until a restart."""
        copy_live(self.config, config)

    @property
    def path(self) -> str | None:
        return self.files.path if self.files is not None else None

    @property
    def total_bytes(self) -> int:
        return self.files.total if self.files is not None else 0

    def note(self, sees_all: bool = True) -> str | None:
        """Why it is off or paused, for humans (the directory named only to those who see all)."""
        if self.state == OFF:
            return self._off_note
        where = f" in {self.path}" if sees_all else ""
        if self.state == PAUSED:
            since = time.strftime("%H:%M:%S", time.localtime(self._paused_since))
            return (f"{self._paused_why}{where} since {since}; sampling goes on; retrying every "
                    f"{self.config.retry_interval:g} s")
        notes = []
        if self.dropped_frames:
            notes.append(f"{self.dropped_frames} frames dropped since start: the disk did not keep up")
        if self.shares.left_out_total:
            notes.append(f"{self.shares.left_out_total} short-lived processes of users over their share of the "
                         "recorder left out since start (counted in the recording)")
        return "; ".join(notes) or None

    # ------------------------------------------------------------------ from the tick and the parts

    def sample(self, seq: int, now: float, rows: Sequence[Sequence[object]]) -> None:
        """The tick's rows (every process, unfiltered). A row object the sampler did not
        rebuild is unchanged: only the others go to the writer's own comparison."""
        writer = self.writer
        if writer is None:
            return
        prev = self._prev_rows
        changed = rows if prev is None or len(prev) != len(rows) else \
            [r for r, p in zip(rows, prev, strict=True) if r is not p]
        self._prev_rows = rows
        shares = self.shares
        if shares.held:
            held = shares.held
            changed = [r for r in changed if (r[0], r[1]) not in held]
        shares.charge_rows(writer.header.sequence, changed)
        writer.add_sample(seq, now, self.interval, changed)
        self._headroom(now)
        self._bound(writer)

    def _headroom(self, now: float) -> None:
        views = self.alerts.headroom
        if (views is self._hr_seen or now - self._hr_at < 1.0) and now - self._hr_at < HEADROOM_EVERY:
            return
        self._hr_seen = views
        marks = _marks(views)
        if (views or self._hr_marks) and (now - self._hr_at >= HEADROOM_EVERY or _moved(self._hr_marks, marks)):
            self._hr_marks, self._hr_at = marks, now
            self._add(self._snapshot(now))

    def _snapshot(self, now: float) -> HeadroomSnapshot:
        return HeadroomSnapshot(now, host_memory(self.procfs.meminfo()), list(self.alerts.headroom))

    def _add(self, frame: Frame, uid: int = 0) -> None:
        """Queue ``frame``, its bytes charged to ``uid`` (root's: not counted)."""
        writer = self.writer
        if writer is not None:
            self.shares.charge(writer.header.sequence, uid, writer.add(frame))
            self._bound(writer)

    def _bound(self, writer: SegmentWriter) -> None:
        if writer.pending_bytes > MAX_PENDING:
            if not self.dropped_frames:
                log.warning("flight recorder: the disk does not keep up; %d MiB of frames dropped (and counted)",
                            writer.pending_bytes // MiB)
            self.dropped_frames += writer.drop_pending()
            self._prev_rows = None

    def attached(self, w: Watched) -> None:
        if self.shares.over(w.uid, self.config.max_bytes):
            self.shares.hold(w, time.monotonic())
            return
        if w.uid not in self.shares.exempt:
            self.shares.uid_of[(w.pid, w.start_time)] = w.uid
        self._add(Attached(w.info()), w.uid)

    def exited(self, w: Watched) -> None:
        if not self.shares.end((w.pid, w.start_time)):
            self._add(Exited(w.pid, w.start_time, w.exited_at or 0.0, w.peak), w.uid)

    def detached(self, w: Watched) -> None:
        key = (w.pid, w.start_time)
        held = self.shares.end(key)
        self.shares.release(key)
        if not held:
            self._add(Detached(w.pid, w.start_time), w.uid)

    def stack_state(self, w: Watched, message: str | None) -> None:
        if (w.pid, w.start_time) not in self.shares.held:
            self._add(StackStateChanged(w.pid, w.start_time, w.stack_state or "", message), w.uid)

    def peak_stack(self, w: Watched, dump: StackDump) -> None:
        if (w.pid, w.start_time) not in self.shares.held:
            self._add(PeakStack(w.pid, w.start_time, dump), w.uid)

    def _thin(self) -> None:
        """Once a second: the held processes now to record, and a ``thinned`` frame per
        user whose processes were left out since the last."""
        shares = self.shares
        if shares.held:
            ripe = shares.ripe(time.monotonic(), self.config.max_bytes)
            for w in ripe:
                self._add(Attached(w.info()), w.uid)
            if ripe:
                self._prev_rows = None  # their rows: in the next sample
        now = time.time()
        for uid, n in shares.take_left_out().items():
            self._add(Thinned(now, uid, n), uid)

    def _refused(self) -> None:
        writer = self.writer
        if writer is not None and writer.refused and not self._refused_told:
            self._refused_told = True
            log.warning("flight recorder: a frame with a non-finite number (NaN, inf) refused, not written")

    def _forget_gone(self, files: RecordFiles) -> None:
        """Segments removed (the bound, a full disk, ``record/`` removed): their bytes no
        longer count in anyone's share."""
        for name in files.take_gone():
            m = NAME.match(name)
            if m is not None:
                self.shares.forget(int(m.group(1)))

    def alert(self, alert: Alert) -> None:
        self._add(AlertRaised(alert))

    def keyframe(self, now: float) -> list[Frame]:
        """What a segment opens with, so that it reads on its own: every process known (in
        attach order), the headroom, the stacks at peak, the alerts firing."""
        entries = self.registry.entries
        held = self.shares.held
        frames: list[Frame] = [Attached(_keyframe_info(w)) for w in entries.values()
                               if (w.pid, w.start_time) not in held]
        if self.alerts.headroom:
            frames.append(self._snapshot(now))
        for key, ps in self.stacks.stacks.items():
            peaked = entries.get(key)
            if peaked is not None and ps.at_peak is not None and (peaked.pid, peaked.start_time) not in held:
                frames.append(PeakStack(peaked.pid, peaked.start_time, ps.at_peak))
        frames.extend(AlertRaised(a) for a in self.alerts.book.active.values())
        return frames

    # ------------------------------------------------------------------ off the tick

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        assert self._io is not None
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    async def start(self) -> None:
        """Open the directory and the first segment (before the first tick)."""
        if self._off_note is not None or self.state_dir is None:
            return
        try:
            self.files = RecordFiles(self.state_dir.fd, self.state_dir.path)
        except (RecordDirRefused, OSError) as exc:
            self._off_note = f"not recording: {exc}"
            log.warning("flight recorder off: %s", exc)
            return
        self._io = ThreadPoolExecutor(1, thread_name_prefix="memagent-recorder")
        self.state = ON
        await self._begin(b"")
        if self.state == ON:
            log.info("flight recorder writing to %s (at most %d MiB, segments of %d KiB)", self.files.path,
                     self.config.max_bytes // MiB, self.config.segment_size // 1024)

    async def run(self) -> None:
        """A batch a second until :meth:`stop`; then the last one, and the segment synced and closed."""
        if self.files is None:
            return
        try:
            while not self._stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), FLUSH_EVERY)
                await self.flush()
        finally:
            await self._shut()

    def stop(self) -> None:
        self._stop.set()

    async def flush(self) -> None:
        files = self.files
        assert files is not None
        if self.writer is None:
            if self.state == PAUSED and time.monotonic() >= self._retry_at:
                await self._begin(b"")
            return
        self._thin()
        self._refused()
        raw = self.writer.take_raw()
        if files.size >= self.config.segment_size or time.monotonic() - self._started >= SEGMENT_SECONDS \
                or self.config.max_bytes != self._max_bytes:
            await self._begin(raw)  # a new segment; the old one gets ``raw`` first
            return
        if raw:
            try:
                written = await self._call(files.append, raw, LEVEL)
            except OSError as exc:
                self._pause(exc)
                return
            finally:
                self._after_io(files)
            if not written:  # record/ was removed: made again, with a new segment
                await self._begin(b"")

    def _after_io(self, files: RecordFiles) -> None:
        """What the thread did besides writing: segments removed (shares), room freed (a log line)."""
        self._forget_gone(files)
        if files.freed_for_room > self._freed_told:
            level = logging.WARNING if not self._freed_told else logging.DEBUG
            log.log(level, "flight recorder: the disk is full; %d of its own oldest segments removed for room "
                    "(%d since the start)", files.freed_for_room - self._freed_told, files.freed_for_room)
            self._freed_told = files.freed_for_room

    async def _begin(self, tail: bytes) -> None:
        """Close the current segment (after ``tail``, its last frames) and begin the next,
        keyframe first. The new writer takes the tick's frames from now on: nothing is
        lost between the two, and the thread writes them in this order."""
        files = self.files
        assert files is not None
        now = time.time()
        header = SegmentHeader(FORMAT_VERSION, os.uname().nodename, now, self.interval, list(PROTOCOL_VERSION),
                               SOFTWARE, "daemon", os.getpid(), self.procfs.meminfo().get("MemTotal") or None,
                               files.next_sequence)
        writer = SegmentWriter(header, level=LEVEL)
        for frame in self.keyframe(now):
            uid = frame.process.uid if isinstance(frame, Attached) else 0
            self.shares.charge(header.sequence, uid, writer.add(frame))
        self.writer, self._prev_rows, self._max_bytes = writer, None, self.config.max_bytes
        self._hr_at, self._hr_seen = now, self.alerts.headroom
        self._hr_marks = _marks(self._hr_seen)
        keyframe = writer.take_raw()
        try:
            if tail:
                await self._call(files.append, tail, LEVEL)
            await self._call(files.begin, now, writer.header_bytes(), keyframe, LEVEL, self.config.segment_size)
        except (OSError, RecordDirRefused) as exc:
            self._pause(exc)
            return
        finally:
            self._after_io(files)
        self._started = time.monotonic()
        dropped = await self._call(files.enforce, self.config.max_bytes, self.config.segment_size)
        self._forget_gone(files)
        if dropped:
            log.debug("flight recorder: dropped %s", ", ".join(dropped))
        if self.state == PAUSED:
            log.info("flight recorder writing again to %s", files.path)
        self.state = ON

    def _pause(self, exc: OSError | RecordDirRefused) -> None:
        self.writer, self._prev_rows = None, None
        self._retry_at = time.monotonic() + self.config.retry_interval
        if self.state == PAUSED:
            return
        why = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        self.state, self._paused_since, self._paused_why = PAUSED, time.time(), why[:1].lower() + why[1:]
        log.warning("flight recorder paused: %s", self.note())
        if self.files is not None:
            self._io_submit(self.files.close_quietly)

    def _io_submit(self, fn: Callable[[], None]) -> None:
        if self._io is not None:
            self._io.submit(fn)

    async def _shut(self) -> None:
        files, io = self.files, self._io
        if files is None or io is None:
            return
        writer, self.writer = self.writer, None
        views = self.alerts.headroom
        if writer is not None and views and _marks(views) != self._hr_marks:
            writer.add(self._snapshot(time.time()))  # the headroom as it ended, if not recorded yet
        raw = writer.take_raw() if writer is not None else b""
        try:
            if raw:
                await self._call(files.append, raw, LEVEL)
        except OSError as exc:
            log.warning("flight recorder: the last frames not written: %s", exc.strerror or exc)
        finally:
            # After whatever was submitted (even if this task was cancelled): blocks the loop
            # for one fdatasync, at shutdown only.
            shut = io.submit(files.shut)
            io.shutdown(wait=True)
            self._io = None
            failed = shut.exception()
            if failed is not None:
                log.warning("flight recorder: the last segment not synced: %s", failed)
