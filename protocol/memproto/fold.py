"""One fold of a frame stream into per-process figures: the peaks every reader of the
stream shares (``memagent run``'s gate, the recording timeline behind ``history``,
``report`` and ``plot``), written once.

A process is a **(PID, start time)** (``docs/protocol.md`` §11.1): a PID the kernel reuses
is a new process with figures of its own, never a continuation of the old one's peak.

Pure: frames in (:meth:`Fold.apply`, one at a time, in stream order), figures out; no
socket, no clock, no policy. What a reader does with a window of time or a filter stays
the reader's: it chooses which frames to hand over.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .frames import Attached, Exited, Frame, Sample
from .records import ProcessSample
from .text import fuller_cmdline

#: A process: its PID and its start time (Unix seconds), as the frames give them.
Key = tuple[int, float]


@dataclass(slots=True)
class ProcessFigures:
    """What the stream has said of one process so far."""

    pid: int
    start_time: float
    #: As its ``attached`` frame gives them (empty until one is seen).
    name: str = ""
    label: str | None = None
    cmdline: list[str] = field(default_factory=list)
    alive: bool = True
    #: The last sample's figures (``None``: not known, or not sampled yet).
    rss_bytes: int | None = None
    vram_bytes: int | None = None
    #: The highest ``rss_peak_bytes`` the wire gave (a sample's or the exit's), the time of
    #: the first frame that showed it, and whether that sample called it exact.
    rss_peak_bytes: int = 0
    rss_peak_time: float | None = None
    rss_peak_exact: bool = True
    #: The highest ``vram_peak_bytes`` sampled and when first (``None``: never known).
    vram_peak_bytes: int | None = None
    vram_peak_time: float | None = None
    #: The first and last sample that had a row for it.
    first_seen: float | None = None
    last_seen: float | None = None
    #: When it was first known gone: its ``exited`` frame's time, else the first sample
    #: that showed it not alive (an ``exited`` frame, which comes later, overrides it).
    exited_at: float | None = None
    #: The peak its ``exited`` frame gave (``None``: no exit record seen).
    exit_peak_bytes: int | None = None

    @property
    def key(self) -> Key:
        return (self.pid, self.start_time)

    @property
    def exit_seen(self) -> bool:
        """Whether its ``exited`` frame came (the agent's exit record, with the final peak)."""
        return self.exit_peak_bytes is not None

    def take_sample(self, r: ProcessSample, time: float) -> None:
        self.alive = r.alive
        self.rss_bytes, self.vram_bytes = r.rss_bytes, r.vram_bytes
        self.first_seen = time if self.first_seen is None else self.first_seen
        self.last_seen = time
        if not r.alive and self.exited_at is None:
            self.exited_at = time
        if r.rss_peak_bytes > self.rss_peak_bytes or self.rss_peak_time is None:
            # The exactness is the one of the sample that set the peak (nil: an older
            # agent that does not say, exact as the list's flag defaults).
            self.rss_peak_bytes, self.rss_peak_time = r.rss_peak_bytes, time
            self.rss_peak_exact = r.rss_peak_exact is not False
        vram_peak = r.vram_peak_bytes
        if vram_peak is not None and (self.vram_peak_bytes is None or vram_peak > self.vram_peak_bytes):
            self.vram_peak_bytes, self.vram_peak_time = vram_peak, time

    def take_exit(self, frame: Exited) -> None:
        self.alive = False
        self.exited_at = frame.time
        self.exit_peak_bytes = frame.rss_peak_bytes
        if frame.rss_peak_bytes > self.rss_peak_bytes:
            self.rss_peak_bytes, self.rss_peak_time = frame.rss_peak_bytes, frame.time


class Fold:
    """Per-(PID, start time) figures of a frame stream: ``attached`` gives a process its
    name, label and command line; each ``sample`` row its current figures and raises its
    peaks; ``exited`` its end and final peak. Other frame types change nothing.

    An ``attached`` frame's own memory figures are not taken: the samples that follow say
    them with a time, and a reader that keeps a window of time (the timeline) must not get
    a peak from before it through a keyframe."""

    def __init__(self) -> None:
        self.processes: dict[Key, ProcessFigures] = {}

    def get(self, key: Key) -> ProcessFigures | None:
        return self.processes.get(key)

    def _figures(self, pid: int, start_time: float) -> ProcessFigures:
        key = (pid, start_time)
        figures = self.processes.get(key)
        if figures is None:
            figures = self.processes[key] = ProcessFigures(pid, start_time)
        return figures

    def apply(self, frame: Frame) -> bool:
        """Fold in one frame; False for a frame type that says nothing of the figures."""
        if isinstance(frame, Sample):
            for r in frame.records():
                self._figures(r.pid, r.start_time).take_sample(r, frame.time)
        elif isinstance(frame, Attached):
            p = frame.process
            figures = self._figures(p.pid, p.start_time)
            figures.name, figures.label = p.name, p.label
            figures.cmdline = fuller_cmdline(p.cmdline, figures.cmdline)
            figures.alive = p.alive
        elif isinstance(frame, Exited):
            self._figures(frame.pid, frame.start_time).take_exit(frame)
        else:
            return False
        return True
