"""What ``memagent plot`` draws, made once from a :class:`~.timeline.Timeline` and shared by
its two renderers (matplotlib for PNG/SVG, the canvas of the HTML page): the series per
process, the Σ peaks, the capacity, the alerts and the exits.

A recording may hold far more points than a picture has pixels (a week at 0.5 s is 1.2
million per process). :func:`decimate` keeps, for each of at most ``buckets`` equal time
slices, the lowest and the highest point in the order they came: a line drawn through
them looks the same at that width, and no peak is ever lost.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from memproto.text import printable
from memproto.units import format_size

from .timeline import Timeline, Track

Point = tuple[float, int]
#: Alerts labelled with their kind at the top of the plot, at most (beyond: lines only),
#: and the least part of the time axis between two labels (a 7-point name turned upright
#: is about 1/60 of a 1400-pixel plot wide).
LABELLED_ALERTS = 12
LABEL_SPACING = 1 / 60

#: Time slices kept per series: about two per horizontal pixel of a 1400 px wide plot.
DEFAULT_BUCKETS = 2000
#: Processes drawn in colour and named in the legend: the highest RSS peaks, and the
#: highest GPU peaks (when not among those already); the others are thin grey lines.
COLOURED_RSS = 10
COLOURED_GPU = 5
COLOURED = COLOURED_RSS + COLOURED_GPU


def decimate(points: Sequence[Point], buckets: int = DEFAULT_BUCKETS) -> list[Point]:
    """At most ``2 * buckets`` of ``points`` (sorted by time): per equal slice of the time
    range, the lowest and the highest, in time order (one point where they are the same).
    The first and last points are always kept; fewer points than that come back as they are."""
    n = len(points)
    if n <= 2 * buckets or buckets < 1:
        return list(points)
    t0, t1 = points[0][0], points[-1][0]
    width = (t1 - t0) / buckets or 1.0
    out: list[Point] = []
    lo = hi = points[0]
    lo_at = hi_at = 0
    current = 0
    for i, p in enumerate(points):
        b = min(int((p[0] - t0) / width), buckets - 1)
        if b != current:
            out.extend(_pair(lo, lo_at, hi, hi_at))
            lo = hi = p
            lo_at = hi_at = i
            current = b
            continue
        if p[1] < lo[1]:
            lo, lo_at = p, i
        if p[1] > hi[1]:
            hi, hi_at = p, i
    out.extend(_pair(lo, lo_at, hi, hi_at))
    if out[0] != points[0]:
        out.insert(0, points[0])
    if out[-1] != points[-1]:
        out.append(points[-1])
    return out


def _pair(lo: Point, lo_at: int, hi: Point, hi_at: int) -> list[Point]:
    if lo_at == hi_at:
        return [lo]
    return [lo, hi] if lo_at < hi_at else [hi, lo]


@dataclass
class ProcessSeries:
    """One process, ready to draw."""

    pid: int
    start_time: float
    title: str
    name: str
    label: str | None
    cmdline: list[str]
    rss: list[Point]
    #: Only the samples where the GPU memory was known.
    vram: list[Point]
    #: How many samples the recording had for it (``rss`` may hold fewer: decimated).
    samples: int
    peak_bytes: int
    peak_time: float | None
    peak_exact: bool
    vram_peak_bytes: int | None
    vram_peak_time: float | None
    exited_at: float | None
    #: Its colour (an index into the renderers' palette of :data:`COLOURED`), or ``None``:
    #: a thin grey line, not in the legend.
    colour: int | None = None

    @property
    def last_rss(self) -> int | None:
        return self.rss[-1][1] if self.rss else None


@dataclass
class AlertMark:
    id: int
    time: float
    kind: str
    severity: str
    state: str
    message: str
    pid: int | None


@dataclass
class PlotData:
    host: str
    interval: float
    first: float
    last: float
    #: Sample frames in the window.
    samples: int
    processes: list[ProcessSeries]
    sum_peaks: list[Point]
    capacity_bytes: int | None
    alerts: list[AlertMark] = field(default_factory=list)
    #: The capacity is the configured ``[host] capacity`` (always drawn), and the host's RAM
    #: (said beside it where it differs).
    capacity_configured: bool = False
    ram_bytes: int | None = None
    #: The daemon's own Σ peaks (share-adjusted: what its alerts judged), from its headroom
    #: snapshots, drawn beside the raw sum of the rows' peaks (shared pages in each); empty
    #: with fewer than two snapshots.
    judged_sum_peaks: list[Point] = field(default_factory=list)
    #: The host's total seen together (the observed bound, docs/headroom.md "Two bounds"):
    #: the watched processes' share-adjusted memory at each moment the headroom snapshots
    #: tell of, drawn under the Σ peaks line; empty with fewer than two such moments.
    together: list[Point] = field(default_factory=list)
    #: What a ``memagent run --record`` recording watched: its title says so.
    command: list[str] | None = None

    @property
    def has_vram(self) -> bool:
        return any(p.vram for p in self.processes)

    @property
    def rss_top(self) -> int:
        """The highest value of the RSS panel."""
        return max([p.peak_bytes for p in self.processes] + [b for p in self.processes for _, b in p.rss], default=0)

    @property
    def vram_top(self) -> int:
        values = [p.vram_peak_bytes or 0 for p in self.processes] + [b for p in self.processes for _, b in p.vram]
        return max(values, default=0)

    @property
    def sum_top(self) -> int:
        return max((b for _, b in [*self.sum_peaks, *self.judged_sum_peaks, *self.together]), default=0)

    #: The two Σ lines' names.
    SUM_LABEL = "Σ peaks, raw (of the processes alive; shared pages in each)"
    JUDGED_LABEL = "Σ peaks, the daemon's (share-adjusted: what it alerts on)"
    TOGETHER_LABEL = "seen together (observed: the highest is a lower bound)"

    @property
    def gap_seconds(self) -> float:
        """Two points of a series farther apart than this have no data between them (the
        daemon was stopped, or the process not watched): their line is broken there, not
        drawn straight across (issue 28). Ten sample intervals, at least 5 s, and at least
        two of the slices a long recording's series are cut into (:func:`decimate`)."""
        return max(10 * self.interval, 5.0, 2 * (self.last - self.first) / DEFAULT_BUCKETS)

    def labelled_alerts(self) -> list[bool]:
        """Which alerts get their kind written at the top of the plot: firing ones, at most
        :data:`LABELLED_ALERTS`, each at least :data:`LABEL_SPACING` of the time axis after
        the one labelled before it (close alerts' names overlapped: issue 28); the others
        are their lines alone (their message is in the tip and the report)."""
        out: list[bool] = []
        last = -math.inf
        spacing = (self.last - self.first) * LABEL_SPACING
        for a in self.alerts:
            label = a.state == "firing" and sum(out) < LABELLED_ALERTS and a.time - last >= spacing
            if label:
                last = a.time
            out.append(label)
        return out

    @property
    def judged_gap_seconds(self) -> float:
        """:attr:`gap_seconds` for the daemon's Σ line: its snapshots are up to 10 s apart."""
        return max(self.gap_seconds, 30.0)

    def show_capacity(self) -> bool:
        """Whether the capacity line is drawn (over the Σ peaks): only when they reach a
        quarter of it. A 1 GiB job on a 512 GiB host would otherwise be a flat line at the
        bottom of its panel; the legend then gives the capacity in words instead."""
        if self.capacity_bytes is None:
            return False
        return self.capacity_configured or self.sum_top * 4 >= self.capacity_bytes

    def capacity_words(self) -> str:
        """``capacity 5 GiB (configured; host RAM 23.5 GiB)``: what the line stands for."""
        assert self.capacity_bytes is not None
        notes = ["configured"] if self.capacity_configured else []
        if self.ram_bytes and self.ram_bytes != self.capacity_bytes:
            notes.append(f"host RAM {format_size(self.ram_bytes, long=True)}")
        return f"capacity {format_size(self.capacity_bytes, long=True)}" + (f" ({'; '.join(notes)})" if notes else "")


def _series(track: Track, buckets: int) -> ProcessSeries:
    rss = list(zip(track.times, track.rss, strict=True))
    vram = [(t, v) for t, v in zip(track.times, track.vram, strict=True) if v is not None]
    return ProcessSeries(
        pid=track.pid, start_time=track.start_time, title=track.title, name=track.name, label=track.label,
        cmdline=list(track.cmdline), rss=decimate(rss, buckets), vram=decimate(vram, buckets),
        samples=len(track.times), peak_bytes=track.peak_bytes, peak_time=track.peak_time,
        peak_exact=track.peak_exact, vram_peak_bytes=track.vram_peak_bytes, vram_peak_time=track.vram_peak_time,
        exited_at=track.exited_at,
    )


def plot_data(timeline: Timeline, buckets: int = DEFAULT_BUCKETS) -> PlotData | None:
    """The picture's data, processes by peak (highest first); ``None`` when the window holds
    no sample."""
    if timeline.first is None or timeline.last is None or not timeline.sum_peaks:
        return None
    processes = [_series(t, buckets) for t in timeline.by_peak()]
    gpu = sorted((p for p in processes if p.vram_peak_bytes), key=lambda p: p.vram_peak_bytes or 0, reverse=True)
    coloured = {id(p) for p in processes[:COLOURED_RSS] + gpu[:COLOURED_GPU]}
    for n, p in enumerate(p for p in processes if id(p) in coloured):
        p.colour = n
    return PlotData(
        host=timeline.host, interval=timeline.interval, first=timeline.first, last=timeline.last,
        command=timeline.command,
        samples=len(timeline.sum_peaks), processes=processes, sum_peaks=decimate(timeline.sum_peaks, buckets),
        judged_sum_peaks=list(timeline.judged_sum_peaks) if timeline.share_adjusted else [],
        together=together if len(together := timeline.host_together()) >= 2 else [],
        capacity_bytes=timeline.capacity_bytes, capacity_configured=timeline.capacity_configured,
        ram_bytes=timeline.ram_bytes,
        alerts=[AlertMark(a.id, a.time, a.kind, a.severity, a.state, a.message, a.pid) for a in timeline.alerts],
    )


def binary_ticks(top: int, most: int = 7) -> list[int]:
    """Y ticks from 0 to past ``top``, at most ``most`` of them, a power of two of bytes
    apart (``64 MiB``, ``256 MiB``, ``2 GiB``): every label is exact in the binary units
    ``memagent ls`` shows."""
    top = max(top, 1)
    step = 1
    while -(-top // step) > most - 1:
        step *= 2
    return [i * step for i in range(-(-top // step) + 1)]


def tick_label(n: int) -> str:
    """An axis label: ``256 MiB``, ``1 GiB``, ``1.5 GiB`` (no trailing zeros)."""
    text = format_size(n, long=True)
    number, _, unit = text.partition(" ")
    if "." in number:
        number = number.rstrip("0").rstrip(".")
    return f"{number} {unit}".strip()


def title(data: PlotData) -> str:
    """``memagent · HOST · 2026-11-30 14:00:00 → 14:30:00 (0:30:00)``, in local time; a
    ``memagent run --record`` recording's begins with its command (``memagent run: python
    train.py · HOST · …``, the command cut to 80 characters)."""
    first, last = dt.datetime.fromtimestamp(data.first), dt.datetime.fromtimestamp(data.last)
    end = f"{last:%H:%M:%S}" if first.date() == last.date() else f"{last:%Y-%m-%d %H:%M:%S}"
    span = dt.timedelta(seconds=round(data.last - data.first))
    host = printable(data.host) or "unknown host"
    what = "memagent"
    if data.command:
        command = printable(" ".join(data.command))
        what = f"memagent run: {command if len(command) <= 80 else command[:79] + '…'}"
    return f"{what} · {host} · {first:%Y-%m-%d %H:%M:%S} → {end} ({span})"


def broken(points: Sequence[Point], gap: float) -> tuple[list[float], list[float]]:
    """``points`` as the x and y lists of a line, a NaN between two points farther apart
    than ``gap`` seconds (a line drawn through NaN stops there and starts again after)."""
    xs: list[float] = []
    ys: list[float] = []
    for i, (t, b) in enumerate(points):
        if i and t - points[i - 1][0] > gap:
            xs.append((t + points[i - 1][0]) / 2)
            ys.append(math.nan)
        xs.append(t)
        ys.append(float(b))
    return xs, ys
