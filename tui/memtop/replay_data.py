"""What ``memtop --replay`` plays: a recording (``docs/recording.md``) read whole into
memory, and the :class:`~memtop.model.FleetModel` it builds at any moment of it.

The recording is read once, through :func:`memproto.recording.open_recording` (whole samples,
as :class:`~memproto.recording.Playback` makes them), into a list of frames, each with the
recorded time at which a live memtop would have had it (:attr:`Recording.times`). A
segment's opening ``attached`` frames become one ``list`` reply: they are what a client
reconnecting at that moment would have been listed, and a process that is not among them
is gone (the daemon restarted without it).

:class:`ReplayEngine` keeps the model of one moment (:attr:`ReplayEngine.clock`): frames are
applied forward in place; a seek back rebuilds a model from the last *checkpoint* before it
(a copy of the model taken as a play or seek first passes a checkpoint mark, at most
:data:`MAX_CHECKPOINTS` of them), so a model after a seek is exactly the one a straight
play to that moment would have built: the peaks as of then, not the recording's final ones.
"""

from __future__ import annotations

import bisect
import copy
from array import array
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass

from memproto.frames import AlertRaised, Attached, Exited, Frame, ListOk, Sample
from memproto.recording import HeadroomSnapshot, PeakStack, RecordingError, SegmentHeader, open_recording

from .model import FleetModel

#: The slowest and fastest replay speeds (``--speed``, the + and - keys).
SPEED_MIN, SPEED_MAX = 1.0, 64.0
#: Fewest recorded seconds between two checkpoints.
CHECKPOINT_SECONDS = 120.0
#: Most checkpoints kept (each a copy of the model: a few KB per process).
MAX_CHECKPOINTS = 64
#: Frames between two looks at whether a long reading or building is to stop.
STOP_CHECK = 1024

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


def check_recording(path: str) -> str | None:
    """Why ``path`` cannot be replayed, in one line for people; None when its segments'
    headers read (what the CLI checks before a screen is drawn)."""
    frames = open_recording([path])
    try:
        first = next(frames, None)
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
class Recording:
    """A recording in memory: its frames in order, and when each was had (never going
    back: a frame without a time of its own, or one dated before the one read before it,
    takes that one's)."""

    source: str
    host: str
    frames: Sequence[Frame]
    times: Sequence[float]
    #: What the reader skipped (a damaged or cut-short frame), one line each.
    damage: tuple[str, ...] = ()

    @property
    def first(self) -> float:
        return self.times[0] if self.times else 0.0

    @property
    def last(self) -> float:
        return self.times[-1] if self.times else 0.0

    @property
    def samples(self) -> int:
        return sum(1 for f in self.frames if isinstance(f, Sample))

    def index_after(self, t: float) -> int:
        """How many frames a live memtop had had at ``t``."""
        return bisect.bisect_right(self.times, t)


def _listed(frames: Iterator[Frame]) -> Iterator[Frame]:
    """The frames, a segment's opening run of ``attached`` as one ``list`` reply.

    A segment that ends right after its header (the one a live flight recorder has just
    begun: its first batch, the keyframe, is not on disk yet) lists nothing: its header
    says nothing of the processes, and an empty ``list`` would have emptied the table at
    ``End`` under the alerts of before (issue 28). Its header alone is kept, for its time."""
    opening: list[Attached] | None = None
    for frame in frames:
        if opening is not None:
            if isinstance(frame, Attached):
                opening.append(frame)
                continue
            yield ListOk(0, [a.process for a in opening])
            opening = None
        if isinstance(frame, SegmentHeader):
            opening = []
        yield frame
    if opening:
        yield ListOk(0, [a.process for a in opening])


def load_recording(source: str, frames: Iterator[Frame] | None = None,
                   stopped: Callable[[], bool] = lambda: False) -> Recording:
    """Read the recording at ``source`` (a segment file or a directory of them) whole;
    ``frames``: its frames already read (tests). :class:`RecordingError` or ``OSError``
    when it cannot be read at all. ``stopped`` is asked now and then: True cuts the
    reading short (memtop quits; the thread reading must not hold it up)."""
    damage: list[str] = []
    stream = frames if frames is not None else open_recording([source], on_damage=damage.append)
    kept: list[Frame] = []
    times = array("d")
    host = ""
    now: float | None = None
    for frame in _listed(stream):
        if len(kept) % STOP_CHECK == 0 and stopped():
            break
        own = _own_time(frame)
        if own is not None and (now is None or own > now):
            now = own
        if now is None:
            continue  # nothing before the first header: a stream of frames only (tests)
        if isinstance(frame, SegmentHeader):
            host = host or frame.host
        kept.append(frame)
        times.append(now)
    return Recording(source, host, kept, times, tuple(damage))


class ReplayEngine:
    """The model of one moment of a recording, moved forward in place (:meth:`advance`) or
    rebuilt for any moment (:meth:`base_for` then :meth:`build`, which may run in a thread:
    it touches a model of its own and the checkpoints only)."""

    def __init__(self, recording: Recording, every: float | None = None) -> None:
        self.recording = recording
        self.model = FleetModel()
        #: Frames applied to :attr:`model`: ``frames[:pos]``.
        self.pos = 0
        #: The moment shown (between frames, while playing).
        self.clock = recording.first
        #: Recorded seconds between two checkpoints.
        self.every = every or max(CHECKPOINT_SECONDS, (recording.last - recording.first) / MAX_CHECKPOINTS)
        self._marks = self._checkpoint_marks()
        #: Frame index -> the model after the frames before it.
        self._checkpoints: dict[int, FleetModel] = {}
        #: Set when memtop quits: a build in a thread ends early (its model is not shown).
        self.stopped = False

    def _checkpoint_marks(self) -> set[int]:
        """The frame indexes where a checkpoint is taken: the first frame of each
        :attr:`every` seconds (the same wherever a play or a seek passes them)."""
        rec, marks = self.recording, set()
        mark = rec.first + self.every
        while mark < rec.last:
            marks.add(rec.index_after(mark - 1e-9))
            mark += self.every
        return marks

    @property
    def at_end(self) -> bool:
        return self.pos >= len(self.recording.frames)

    @property
    def next_time(self) -> float:
        """When the next frame comes (the end when none does)."""
        rec = self.recording
        return rec.times[self.pos] if self.pos < len(rec.times) else rec.last

    def clamp(self, t: float) -> float:
        return min(max(t, self.recording.first), self.recording.last)

    def advance(self, t: float) -> int:
        """Apply in place every frame had by ``t``; the clock goes to ``t``. Returns how
        many frames were applied."""
        end = self.recording.index_after(t)
        applied = max(0, end - self.pos)
        if applied:
            self.pos = self._apply(self.model, self.pos, end)
        self.clock = t
        return applied

    def base_for(self, end: int) -> tuple[FleetModel, int]:
        """A model to build the one after ``frames[:end]`` from, and how many frames it has:
        a copy of the nearest checkpoint or of the current model, else an empty one. Call
        it in the UI thread (it copies the model shown)."""
        best = max((i for i in self._checkpoints if i <= end), default=-1)
        if best <= self.pos <= end:
            return copy.deepcopy(self.model), self.pos
        if best >= 0:
            return copy.deepcopy(self._checkpoints[best]), best
        return FleetModel(), 0

    def build(self, base: FleetModel, start: int, end: int) -> FleetModel:
        """``base`` (the model after ``frames[:start]``) moved on to ``frames[:end]``."""
        self._apply(base, start, end)
        return base

    def install(self, model: FleetModel, end: int, t: float) -> None:
        """Show ``model`` (built to ``frames[:end]``) at ``t``."""
        self.model, self.pos, self.clock = model, end, t

    def _apply(self, model: FleetModel, start: int, end: int) -> int:
        frames, marks, checkpoints = self.recording.frames, self._marks, self._checkpoints
        for i in range(start, end):
            if i % STOP_CHECK == 0 and self.stopped:
                return i
            if i in marks and i not in checkpoints:
                checkpoints[i] = copy.deepcopy(model)
            model.apply(frames[i])  # the live app's table (FleetModel.apply): the same frames, the same model
        return end
