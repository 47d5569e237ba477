"""What ``memtop --replay`` plays: a recording (``docs/recording.md``) read as it plays,
never held whole, and the :class:`~memtop.model.FleetModel` it builds at any moment of it.

A replay's memory is bounded whatever the recording's length (issue 26: an hour of 100
busy processes read whole took about 250 MB). Three parts:

* :class:`Reader`: the frames of a :class:`Span` (the segments of ``--since``/``--until``)
  in order, each with the recorded time at which a live memtop would have had it (never
  going back: a frame without a time of its own, or one dated before the one read before
  it, takes that one's). A segment's opening ``attached`` frames become one ``list`` reply:
  they are what a client reconnecting at that moment would have been listed, and a process
  that is not among them is gone (the daemon restarted without it). A reader can resume
  where another was (:class:`Position`: a byte offset in a segment, the sample rows then).
* :class:`Index`: the one straight play of the whole span, in a thread, started once the
  first screen is up. It learns where the recording ends, tells its damage, and leaves a
  :class:`Checkpoint` every :attr:`Index.every` recorded seconds: the model then and the
  reader's position, pickled and compressed, at most :data:`MAX_CHECKPOINT_BYTES` of them
  (past that every other one is dropped and the spacing doubles).
* :class:`ReplayEngine`: the model of one moment (:attr:`ReplayEngine.clock`), moved
  forward in place by its own :class:`Playhead`; a seek builds another playhead from the
  nearest checkpoint before the moment (or the one shown, when nearer) and plays it on,
  so the model after a seek is exactly the one a straight play to that moment builds: the
  peaks as of then, not the recording's final ones.
"""

from __future__ import annotations

import copy
import math
import os
import pickle
import time
import zlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

from memproto.frames import AlertRaised, Attached, Exited, Frame, ListOk, Sample
from memproto.recording import (
    HeadroomSnapshot,
    PeakStack,
    Playback,
    RecordingError,
    SegmentHeader,
    open_recording,
    played_frames,
    recording_segments,
)

from .model import FleetModel

#: The slowest and fastest replay speeds (``--speed``, the + and - keys).
SPEED_MIN, SPEED_MAX = 1.0, 64.0
#: Fewest recorded seconds between two checkpoints (doubled as they are thinned).
CHECKPOINT_SECONDS = 60.0
#: Most checkpoints kept, and most bytes of them (each the model pickled and compressed:
#: about 200 KB at 100 processes, 2 MB at 1000).
MAX_CHECKPOINTS = 64
MAX_CHECKPOINT_BYTES = 24 * 1024 * 1024
#: Frames between two looks at whether a long reading or building is to stop.
STOP_CHECK = 1024
#: zlib level of a checkpoint (1: a few milliseconds for 100 processes; the ratio barely moves above).
CHECKPOINT_LEVEL = 1
#: Fewest wall seconds between two words from the index that it has read on (the header's figure).
PROGRESS_EVERY = 0.25

Timed = tuple[float, Frame]


def _own_time(frame: Frame) -> float | None:
    """When ``frame`` happened, where it says so."""
    if isinstance(frame, (Sample, Exited, HeadroomSnapshot)):
        return frame.time
    if isinstance(frame, SegmentHeader):
        return frame.start_time
    if isinstance(frame, AlertRaised):
        return frame.alert.time
    if isinstance(frame, PeakStack):
        return frame.dump.time
    return None


def check_recording(path: str, since: float | None = None, until: float | None = None) -> str | None:
    """Why ``path`` cannot be replayed (from ``since`` to ``until``), in one line for
    people; None when its segments' headers read and one of them is in the range (what
    the CLI checks before a screen is drawn)."""
    frames = open_recording([path])
    try:
        first = next(frames, None)
        if first is not None and (since is not None or until is not None):
            Span.open(path, since, until)
    except RecordingError as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot read {exc.filename or path}: {exc.strerror or exc}"
    finally:
        if isinstance(frames, Generator):
            frames.close()  # the segment it holds open
    if first is None:
        return f"{path}: no recording segments (*.mrec) in it"
    return None


@dataclass(frozen=True, slots=True)
class Span:
    """What a replay plays: the segments of a recording that hold ``since``…``until``
    (each with its header), in the order they were written."""

    source: str
    segments: tuple[tuple[str, SegmentHeader], ...]
    since: float | None = None
    until: float | None = None
    #: What was skipped as the headers were read (a segment that is no segment), one line each.
    damage: tuple[str, ...] = ()
    #: Bytes of each segment when opened (how far the index has read, for the header).
    sizes: tuple[int, ...] = ()

    @classmethod
    def open(cls, source: str, since: float | None = None, until: float | None = None) -> Span:
        """The span of ``source`` (a segment file or a directory of them). RecordingError
        or OSError when it cannot be read at all, or when nothing of it is in the range."""
        damage: list[str] = []
        segments = tuple(recording_segments([source], since=since, until=until, on_damage=damage.append))
        if not segments:
            raise RecordingError(f"{source}: no recording segments (*.mrec) in it" if since is None and until is None
                                 else f"{source}: nothing recorded in the range asked for")
        sizes = []
        for name, _ in segments:
            try:
                sizes.append(os.stat(name).st_size)
            except OSError:
                sizes.append(0)
        return cls(source, segments, since, until, tuple(damage), tuple(sizes))

    @property
    def host(self) -> str:
        return next((h.host for _, h in self.segments if h.host), "")

    @property
    def first(self) -> float:
        """The moment the replay starts at: ``since``, or the first segment's start."""
        start = self.segments[0][1].start_time
        return start if self.since is None else max(start, self.since)


@dataclass(frozen=True, slots=True)
class Position:
    """Where a :class:`Reader` resumes: in ``segments[segment]``, at the outer frame at byte
    ``offset``, after its first ``skip`` inner frames, with the clock at ``now``. Taken
    right after a sample only (no segment's opening list is pending then); the sample rows
    played so far go with it (:class:`Checkpoint`)."""

    segment: int
    offset: int
    skip: int
    now: float


class Reader:
    """The frames of ``span`` in order, with their times (:data:`Timed`): from the start,
    or from ``at`` with ``playback`` as it was there. ``on_damage`` is told what is skipped
    (the index's reader; the others read the same bytes and stay quiet)."""

    def __init__(self, span: Span, at: Position | None = None, playback: Playback | None = None,
                 on_damage: Callable[[str], None] | None = None) -> None:
        self.span = span
        self.playback = playback if playback is not None else Playback()
        self._at = at
        self._now: float | None = at.now if at is not None else None
        #: Where the frame given out last is: (segment, outer frame's offset, index there).
        self.where = (at.segment, at.offset, at.skip - 1) if at is not None else (0, 0, -1)
        self._frames = self._read(on_damage)

    def __iter__(self) -> Iterator[Timed]:
        return self._frames

    def close(self) -> None:
        self._frames.close()  # the segment it holds open

    def position(self) -> Position:
        """Where a reader resumes after the frame given out last (call it right after a sample)."""
        segment, offset, index = self.where
        return Position(segment, offset, index + 1, self._now if self._now is not None else self.span.first)

    def _timed(self, frame: Frame) -> float | None:
        own = _own_time(frame)
        if own is not None and (self._now is None or own > self._now):
            self._now = own
        return self._now

    def _read(self, on_damage: Callable[[str], None] | None) -> Generator[Timed, None, None]:
        at, until = self._at, self.span.until
        resume = {} if at is None else {"segment": at.segment, "offset": at.offset, "skip": at.skip}
        opening: list[Attached] | None = None
        for segment, offset, index, frame in played_frames(self.span.segments, self.playback, on_damage=on_damage,
                                                           **resume):
            if opening is not None:
                if isinstance(frame, Attached):
                    opening.append(frame)
                    continue
                yield self._now or 0.0, ListOk(0, [a.process for a in opening])
                opening = None
            if index < 0:  # a segment's header: its opening list follows
                opening = []
            now = self._timed(frame)
            if now is None:
                continue
            if until is not None and now > until:
                return
            self.where = (segment, offset, index)
            yield now, frame
        if opening:
            yield self._now or 0.0, ListOk(0, [a.process for a in opening])


class Playhead:
    """A model and the frames that move it: :meth:`advance` applies, through the live
    app's table (:meth:`FleetModel.apply`), every frame had by a moment. ``frames``: a
    :class:`Reader`, or any (time, frame) iterator."""

    def __init__(self, model: FleetModel, frames: Iterator[Timed], reader: Reader | None = None) -> None:
        self.model = model
        self.frames = frames
        self.reader = reader
        self.next: Timed | None = next(frames, None)
        #: When the frame applied last came (a gap is measured from it).
        self.last_applied: float | None = None

    @property
    def at_end(self) -> bool:
        return self.next is None

    def advance(self, t: float, stopped: Callable[[], bool] = lambda: False,
                on_sample: Callable[[float], None] | None = None) -> int:
        """Apply every frame had by ``t``; how many. ``on_sample`` is called after each
        sample is applied, before the next frame is read (the index's checkpoints)."""
        applied, nxt, model = 0, self.next, self.model
        while nxt is not None and nxt[0] <= t:
            if applied % STOP_CHECK == 0 and applied and stopped():
                break
            when, frame = nxt
            model.apply(frame)  # the live app's table: the same frames, the same model
            self.last_applied = when
            applied += 1
            if on_sample is not None and type(frame) is Sample:
                on_sample(when)
            nxt = next(self.frames, None)
        self.next = nxt
        return applied

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The model after the sample at ``time`` and the reader's position then, kept small:
    the model and the rows the reader had played, pickled (our own bytes, made in this
    process) and compressed."""

    time: float
    position: Position
    blob: bytes

    @classmethod
    def take(cls, time: float, model: FleetModel, reader: Reader) -> Checkpoint:
        state = pickle.dumps((model, reader.playback), protocol=pickle.HIGHEST_PROTOCOL)
        return cls(time, reader.position(), zlib.compress(state, CHECKPOINT_LEVEL))

    def playhead(self, span: Span) -> Playhead:
        """A playhead at this checkpoint (in a thread: it decompresses and reads)."""
        model, playback = pickle.loads(zlib.decompress(self.blob))  # our own bytes, see above
        reader = Reader(span, self.position, playback)
        return Playhead(model, iter(reader), reader)


class Index:
    """The one straight play of a span (:meth:`run`, in a thread): its end, its damage,
    its samples, and its checkpoints (:attr:`checkpoints`, replaced, never changed in
    place: the UI thread reads it while this one writes)."""

    def __init__(self, span: Span, every: float = CHECKPOINT_SECONDS) -> None:
        self.span = span
        self.every = every
        self.checkpoints: tuple[Checkpoint, ...] = ()
        #: The latest moment read so far; the recording's end once :attr:`done`.
        self.last = span.first
        self.samples = 0
        self.damage: list[str] = list(span.damage)
        self.done = False
        self.stopped = False
        self._reader: Reader | None = None

    @property
    def progress(self) -> float:
        """How much of the span's bytes the index has read (0 to 1)."""
        reader, sizes = self._reader, self.span.sizes
        if self.done or reader is None or not sum(sizes):
            return 1.0 if self.done else 0.0
        segment, offset, _ = reader.where
        return min(1.0, (sum(sizes[:segment]) + offset) / sum(sizes))

    def run(self, on_progress: Callable[[], None] = lambda: None) -> None:
        """Play the span through once, to its end or until :attr:`stopped`."""
        self._reader = reader = Reader(self.span, on_damage=self.damage.append)
        head = Playhead(FleetModel(), iter(reader), reader)
        mark = self.span.first + self.every
        told = time.monotonic()

        def sampled(t: float) -> None:
            nonlocal mark, told
            self.samples += 1
            self.last = t
            if t >= mark:
                self._keep(Checkpoint.take(t, head.model, reader))
                mark = t + self.every
                if time.monotonic() - told >= PROGRESS_EVERY:
                    told = time.monotonic()
                    on_progress()

        try:
            while not head.at_end and not self.stopped:
                head.advance(math.inf, lambda: self.stopped, sampled)
            if head.last_applied is not None:
                self.last = max(self.last, head.last_applied)
        finally:
            head.close()
            self.done = not self.stopped
            on_progress()

    def _keep(self, checkpoint: Checkpoint) -> None:
        kept = (*self.checkpoints, checkpoint)
        while len(kept) > MAX_CHECKPOINTS or sum(len(c.blob) for c in kept) > MAX_CHECKPOINT_BYTES:
            kept = kept[::2]
            self.every *= 2
        self.checkpoints = kept

    def best(self, t: float) -> Checkpoint | None:
        """The latest checkpoint at or before ``t``."""
        return next((c for c in reversed(self.checkpoints) if c.time <= t), None)


class ReplayEngine:
    """The model of one moment of a span, moved forward in place (:meth:`advance`) or
    rebuilt for any moment (:meth:`plan` then :meth:`build`, which may run in a thread:
    it touches a model and a reader of its own only, then :meth:`install`)."""

    def __init__(self, span: Span, index: Index | None = None) -> None:
        self.span = span
        self.index = index if index is not None else Index(span)
        reader = Reader(span)
        self.head = Playhead(FleetModel(), iter(reader), reader)
        #: The moment shown (between frames, while playing).
        self.clock = span.first
        #: Set when memtop quits: a build in a thread ends early (its model is not shown).
        self.stopped = False

    @property
    def model(self) -> FleetModel:
        return self.head.model

    @property
    def first(self) -> float:
        return self.span.first

    @property
    def last(self) -> float:
        """The recording's end as known: the index's, or where the replay has read to."""
        return max(self.index.last, self.head.last_applied or self.span.first)

    @property
    def at_end(self) -> bool:
        return self.head.at_end

    @property
    def next_time(self) -> float:
        """When the next frame comes (the end when none does)."""
        nxt = self.head.next
        return nxt[0] if nxt is not None else self.last

    @property
    def previous_time(self) -> float:
        """When the frame applied last came (the start before any)."""
        return self.head.last_applied if self.head.last_applied is not None else self.first

    def clamp(self, t: float) -> float:
        """``t`` within the recording; past the end read so far only while the index reads on."""
        t = max(t, self.first)
        return min(t, self.last) if self.index.done else t

    def advance(self, t: float) -> int:
        """Apply in place every frame had by ``t``; the clock goes to ``t`` (to the last
        frame's time when the recording ends before). How many frames were applied."""
        applied = self.head.advance(t, lambda: self.stopped)
        self.clock = self._shown(self.head, t)
        return applied

    def _shown(self, head: Playhead, t: float) -> float:
        if head.at_end and head.last_applied is not None:
            return max(self.first, min(t, head.last_applied))
        return t

    def plan(self, t: float) -> tuple[Playhead | Checkpoint | None, bool]:
        """What to build the model of ``t`` from, and whether the way is long (a thread's):
        the playhead shown itself when ``t`` is a little ahead of it (:meth:`advance`), a
        copy of it when ``t`` is further ahead and no checkpoint is nearer (in the UI
        thread: it copies the model shown), else the latest checkpoint before ``t``, or
        nothing (from the start)."""
        best = self.index.best(t)
        if self.clock <= t and (best is None or best.time <= self.clock):
            if t - self.clock <= IN_PLACE_SECONDS:
                return self.head, False
            head = self.head
            copied = Playhead.__new__(Playhead)
            copied.model, copied.frames, copied.reader = copy.deepcopy(head.model), head.frames, head.reader
            copied.next, copied.last_applied = head.next, head.last_applied
            return copied, True
        return best, True

    def build(self, base: Playhead | Checkpoint | None, t: float) -> Playhead:
        """The playhead of :meth:`plan` moved on to ``t``."""
        if isinstance(base, Checkpoint):
            head = base.playhead(self.span)
        elif base is None:
            reader = Reader(self.span)
            head = Playhead(FleetModel(), iter(reader), reader)
        else:
            head = base
        head.advance(t, lambda: self.stopped)
        return head

    def install(self, head: Playhead, t: float) -> None:
        """Show ``head`` (built to ``t``): the one shown before is closed unless it goes on in it."""
        if head.reader is not self.head.reader:
            self.head.close()
        self.head = head
        self.clock = self._shown(head, t)

    def seek(self, t: float) -> None:
        """:meth:`plan`, :meth:`build` and :meth:`install` in one (tests, short ways)."""
        t = self.clamp(t)
        base, _ = self.plan(t)
        if base is self.head:
            self.advance(t)
        else:
            self.install(self.build(base, t), t)

    def close(self) -> None:
        self.stopped = self.index.stopped = True
        self.head.close()


#: Recorded seconds a seek forward plays on the UI loop (about 0.1 s for 100 busy
#: processes at 0.5 s); a longer way is built in a thread, the screen staying meanwhile.
IN_PLACE_SECONDS = 20.0
