"""What a recording says, per process and for the box: the data behind ``memagent history``,
``report`` and ``plot`` (docs/recording.md). Built by one pass over the frames of
:func:`memproto.recording.open_recording`; the commands only present it.

Times given by users (``--since 2h``, ``--since 2026-11-30T14:00``) are parsed by
:mod:`memproto.when`, once for every command (memtop's replay too).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from memproto.fold import Fold, Key, ProcessFigures
from memproto.frames import AlertRaised, Attached, Exited, Frame, Sample
from memproto.recording import HeadroomSnapshot, PeakStack, SegmentHeader
from memproto.records import Alert, StackDump
from memproto.text import display_name
from memproto.vocabulary import AlertKind, Resource

from ..alerting.observed import HighestTogether, Together, moments_of


def iso(t: float) -> str:
    """A time for JSON and text: ISO 8601 in local time with its offset, to the second."""
    return dt.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


@dataclass
class Track:
    """One process (PID and start time) over the recording."""

    pid: int
    start_time: float
    name: str = ""
    label: str | None = None
    cmdline: list[str] = field(default_factory=list)
    #: Sample times, and the values at them (RSS, GPU memory: ``None`` unknown).
    times: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    vram: list[int | None] = field(default_factory=list)
    #: The highest ``rss_peak_bytes`` seen, and the first sample time that showed it.
    peak_bytes: int = 0
    peak_time: float | None = None
    peak_exact: bool = True
    vram_peak_bytes: int | None = None
    vram_peak_time: float | None = None
    exited_at: float | None = None
    #: The stack at the peak, when the daemon took one.
    peak_stack: StackDump | None = None

    @property
    def key(self) -> Key:
        return (self.pid, self.start_time)

    @property
    def title(self) -> str:
        """How the process is named in a legend or a report (:func:`memproto.text.display_name`)."""
        return display_name(self.label, self.name, self.cmdline) or str(self.pid)

    def take(self, figures: ProcessFigures) -> None:
        """The peaks and the exit as the fold has them at the end of the pass."""
        self.peak_bytes, self.peak_time, self.peak_exact = (
            figures.rss_peak_bytes, figures.rss_peak_time, figures.rss_peak_exact)
        self.vram_peak_bytes, self.vram_peak_time = figures.vram_peak_bytes, figures.vram_peak_time
        self.exited_at = figures.exited_at


@dataclass
class Timeline:
    """A recording, cut to ``[since, until]`` and to the processes asked for."""

    host: str = ""
    interval: float = 0.0
    #: What a ``memagent run --record`` recording watched (its header's ``command``).
    command: list[str] | None = None
    first: float | None = None
    last: float | None = None
    tracks: dict[Key, Track] = field(default_factory=dict)
    #: At each sample: its time and the sum of the peaks of the processes alive then (raw:
    #: a page shared by forked workers counts in each of them).
    sum_peaks: list[tuple[float, int]] = field(default_factory=list)
    #: The daemon's own Σ peaks of the host (share-adjusted: docs/headroom.md), at each
    #: headroom snapshot in the window: what it judged its alerts with. Empty when the
    #: recording has none (an older one, or a window between two snapshots).
    judged_sum_peaks: list[tuple[float, int]] = field(default_factory=list)
    #: The host's RAM (from the segment headers and headroom snapshots).
    ram_bytes: int | None = None
    #: The host headroom's capacity as the daemon judged Σ peaks against it, from the
    #: headroom snapshots in the window (the last one's; the configured ``[host] capacity``
    #: when set): None when the window holds no snapshot (the RAM stands in).
    judged_capacity_bytes: int | None = None
    #: Whether that capacity is the configured ``[host] capacity``.
    capacity_configured: bool = False
    alerts: list[Alert] = field(default_factory=list)
    headroom: list[HeadroomSnapshot] = field(default_factory=list)
    #: Per headroom resource, the moments the headroom snapshots in the window tell of
    #: (:func:`memagent.alerting.observed.moments_of`: the total together then, and the
    #: daemon's own maxima reached inside the window), in the order read. Empty with a
    #: subset of the processes (``--pid``, ``--label``): the totals are the whole fleet's.
    together: dict[str, list[Together]] = field(default_factory=dict)
    #: Per headroom resource: its name, and the highest Σ peaks and last capacity the
    #: snapshots in the window give.
    resource_names: dict[str, str] = field(default_factory=dict)
    resource_sum_peaks: dict[str, int] = field(default_factory=dict)
    resource_capacity: dict[str, int] = field(default_factory=dict)
    #: What the reader skipped (damaged frames), one line each.
    damage: list[str] = field(default_factory=list)
    segments: int = 0

    @property
    def capacity_bytes(self) -> int | None:
        """What Σ peaks is judged against: the daemon's own capacity where recorded, else
        the host's RAM (issue 28: a report judged against the RAM while the daemon's
        alerts, in the same report, judged against the configured capacity)."""
        return self.judged_capacity_bytes if self.judged_capacity_bytes is not None else self.ram_bytes

    @property
    def oom_kills(self) -> list[Alert]:
        return [a for a in self.alerts if a.kind == AlertKind.OOM_KILL]

    @property
    def share_adjusted(self) -> bool:
        """Whether the highest Σ peaks given is the daemon's share-adjusted one: two
        headroom snapshots or more in the window (one says nothing of the rest of it)."""
        return len(self.judged_sum_peaks) >= 2

    def sum_series(self) -> list[tuple[float, int]]:
        """The Σ peaks a report judges: the daemon's own, as it judged its alerts, where
        recorded (issue 28: a raw Σ counting forked workers' shared buffer four times stood
        at 175 % of the capacity while the daemon, rightly, warned at 90 %); else the raw
        sum of the rows."""
        return self.judged_sum_peaks if self.share_adjusted else self.sum_peaks

    def highest_sum(self) -> tuple[float, int] | None:
        series = self.sum_series()
        return max(series, key=lambda ts: ts[1]) if series else None

    def highest_raw_sum(self) -> tuple[float, int] | None:
        return max(self.sum_peaks, key=lambda ts: ts[1]) if self.sum_peaks else None

    def highest_together(self) -> HighestTogether:
        """The observed bound over the window, per resource: the live daemon's fold
        (:class:`~memagent.alerting.observed.HighestTogether`) over the recorded moments."""
        fold = HighestTogether()
        for resource, moments in self.together.items():
            for m in moments:
                fold.see(resource, m)
        return fold

    def host_together(self) -> list[tuple[float, int]]:
        """The host's total together at each snapshot (the plot's line under Σ peaks), in time order."""
        return sorted({(m.at, m.total) for m in self.together.get(Resource.HOST, [])})

    def by_peak(self) -> list[Track]:
        return sorted(self.tracks.values(), key=lambda t: t.peak_bytes, reverse=True)


class _Filter:
    def __init__(self, pids: Iterable[int], labels: Iterable[str]) -> None:
        self.pids, self.labels = set(pids), set(labels)
        self.everyone = not self.pids and not self.labels

    def wants(self, pid: int, label: str | None) -> bool:
        return self.everyone or pid in self.pids or (label is not None and label in self.labels)


def build_timeline(frames: Iterable[Frame], *, since: float | None = None, until: float | None = None,
                   pids: Iterable[int] = (), labels: Iterable[str] = ()) -> Timeline:
    """One pass over a recording's frames (whole samples: :class:`memproto.recording.Playback`).

    The per-process peaks are :class:`memproto.fold.Fold`'s, fed what the timeline keeps:
    every ``attached`` frame (wanted or not: labels decide when a process is first
    sampled), the samples inside ``[since, until]`` and the exits inside it of the
    processes shown."""
    tl = Timeline()
    want = _Filter(pids, labels)
    fold = Fold()
    peak_stacks: dict[Key, StackDump] = {}

    def inside(t: float) -> bool:
        return (since is None or t >= since) and (until is None or t <= until)

    for frame in frames:
        if isinstance(frame, Sample):
            if inside(frame.time):
                _add_sample(tl, frame, fold, want)
            elif until is not None and frame.time > until:
                break
        elif isinstance(frame, Exited):
            if (frame.pid, frame.start_time) in tl.tracks and inside(frame.time):
                fold.apply(frame)
        elif isinstance(frame, Attached):
            fold.apply(frame)
        else:
            _add_other(tl, frame, inside, want, peak_stacks)
    for key, track in tl.tracks.items():
        track.take(fold.processes[key])
        track.peak_stack = peak_stacks.get(key)
    return tl


def _add_other(tl: Timeline, frame: Frame, inside: Callable[[float], bool], want: _Filter,
               peak_stacks: dict[Key, StackDump]) -> None:
    """A frame that is neither a process's nor a sample: the box's, the alerts, the stacks."""
    if isinstance(frame, SegmentHeader):
        tl.segments += 1
        tl.host, tl.interval = frame.host, frame.interval
        tl.command = frame.command or tl.command
        tl.ram_bytes = frame.mem_total_bytes or tl.ram_bytes
    elif isinstance(frame, AlertRaised):
        if inside(frame.alert.time) and (want.everyone or frame.alert.pid is None
                                         or frame.alert.pid in want.pids or want.labels):
            tl.alerts.append(frame.alert)
    elif isinstance(frame, PeakStack):
        # Kept by key: a segment's keyframe has it before the process's first sample.
        if inside(frame.dump.time):
            peak_stacks[(frame.pid, frame.start_time)] = frame.dump
    elif isinstance(frame, HeadroomSnapshot):
        if inside(frame.time):
            tl.headroom.append(frame)
            tl.ram_bytes = frame.host.total_bytes or tl.ram_bytes
            host = next((h for h in frame.headroom if h.resource == Resource.HOST), None)
            if host is not None and host.capacity_bytes:
                tl.judged_capacity_bytes, tl.capacity_configured = host.capacity_bytes, host.configured
            if host is not None and want.everyone:  # a subset (--pid, --label): its own rows
                tl.judged_sum_peaks.append((frame.time, host.sum_peaks_bytes))
            if want.everyone:
                _add_together(tl, frame, inside)


def _add_together(tl: Timeline, frame: HeadroomSnapshot, inside: Callable[[float], bool]) -> None:
    """A headroom snapshot's moments (the observed bound) and each resource's figures."""
    for view in frame.headroom:
        tl.resource_names[view.resource] = view.name
        tl.resource_capacity[view.resource] = view.capacity_bytes
        tl.resource_sum_peaks[view.resource] = max(tl.resource_sum_peaks.get(view.resource, 0), view.sum_peaks_bytes)
    for resource, moment in moments_of(frame.time, frame.headroom):
        if inside(moment.at):
            tl.together.setdefault(resource, []).append(moment)


def _add_sample(tl: Timeline, frame: Sample, fold: Fold, want: _Filter) -> None:
    """One whole sample. With ``--pid``/``--label`` the timeline spans only the samples
    where a process asked for is alive (or is first seen exited): not the whole recording.
    The fold takes the sample after the rows are looked at, so that "first seen exited"
    is asked of the figures before it."""
    total = 0
    shown = want.everyone
    for r in frame.records():
        key = (r.pid, r.start_time)
        figures = fold.get(key)
        track = tl.tracks.get(key)
        if track is None:
            label = figures.label if figures else None
            if not want.wants(r.pid, label):
                continue
            track = tl.tracks[key] = Track(r.pid, r.start_time)
            if figures is not None:
                track.name, track.label, track.cmdline = figures.name, label, list(figures.cmdline)
        if r.alive:
            shown = True
            total += r.rss_peak_bytes
            track.times.append(frame.time)
            track.rss.append(r.rss_bytes)
            track.vram.append(r.vram_bytes)
        elif figures is None or figures.exited_at is None:
            shown = True
    fold.apply(frame)
    if shown:
        tl.first = frame.time if tl.first is None else tl.first
        tl.last = frame.time
        tl.sum_peaks.append((frame.time, total))
