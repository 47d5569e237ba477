"""``memagent plot -o OUT.png|OUT.svg``: the picture, drawn with matplotlib (the optional
``memagent[plot]`` extra; this module is only imported once it is asked for).

Only matplotlib's object API is used (a ``Figure`` and its Agg or SVG canvas, never
``pyplot``): no GUI backend is ever chosen, and nothing global is left behind.

Panels, sharing the time axis: the box (Σ peaks and the capacity: would it fit?), the RSS
per process, and the GPU memory per process when any has some. Every data series
carries a ``gid`` (``rss-PID``, ``vram-PID``, ``peak-PID``, ``vram-peak-PID``,
``exit-PID``, ``sum-peaks``, ``capacity``, ``alert-N``): in an SVG it is the ``id`` of the
series' group, so the file can be checked (and restyled) by series.
"""

from __future__ import annotations

import datetime as dt
import io
import math
from collections.abc import Sequence

import matplotlib as mpl
import matplotlib.dates as mdates
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter

from memproto.text import printable
from memproto.units import format_size
from memproto.vocabulary import AlertState, Severity

from .plot_data import COLOURED, PlotData, Point, ProcessSeries, binary_ticks, broken, tick_label, title

#: tab10, then five darker ones (plot.js has the same).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#bcbd22", "#7f7f7f", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173")
assert len(PALETTE) >= COLOURED
OTHERS = "#bdbdbd"
SUM = "#333333"
#: The total seen together (the observed bound), under the Σ peaks lines.
TOGETHER = "#006d5b"
SEVERITY_COLOUR = {Severity.CRITICAL: "#d62728", Severity.WARNING: "#ff9f1c"}
#: Two peaks' words closer than this (fractions of the panel) would overlap: the lower
#: peak keeps its marker and its words in the legend only.
WORDS_APART = (0.13, 0.07)
DPI = 100


def _text(s: str, limit: int = 40) -> str:
    """Untrusted text (a label, a process name) for a matplotlib string: printable, short,
    and with ``$`` escaped (else it is mathtext, and a stray one fails the drawing)."""
    s = printable(s)
    s = s if len(s) <= limit else s[:limit - 1] + "…"
    return s.replace("$", r"\$")


def _x(times: Sequence[float]) -> list[float]:
    """Unix seconds as matplotlib dates in local wall-clock time (naive, as the box shows it)."""
    days = mdates.date2num([dt.datetime.fromtimestamp(t) for t in times])  # type: ignore[no-untyped-call]
    return [float(d) for d in days]


def _clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S")


def _colour(p: ProcessSeries) -> str:
    return OTHERS if p.colour is None else PALETTE[p.colour]


def _line(ax: Axes, points: Sequence[Point], gid: str, colour: str, width: float, label: str | None,
          gap: float = math.inf, **style: object) -> None:
    """One series, broken where its points are more than ``gap`` seconds apart."""
    xs, ys = broken(points, gap)
    (line,) = ax.plot(_x(xs), ys, color=colour, linewidth=width,
                      label=label or "_nolegend_", zorder=3 if label else 2, **style)  # type: ignore[arg-type]
    line.set_gid(gid)


def _mark(ax: Axes, at: float, value: int, gid: str, colour: str, marker: str, big: bool) -> None:
    (mark,) = ax.plot(_x([at]), [value], marker=marker, markersize=8 if big else 5, color=colour,
                      markeredgecolor="black" if big else colour, markeredgewidth=0.6, linestyle="none",
                      zorder=5 if big else 4, label="_nolegend_")
    mark.set_gid(gid)


class Words:
    """Each coloured peak's value and time above its marker, highest first, unless it would
    overlap words already placed on the same panel."""

    def __init__(self, ax: Axes) -> None:
        self.ax = ax
        self.placed: list[tuple[float, float]] = []

    def add(self, at: float, value: int, colour: str) -> None:
        (x0, x1), (y0, y1) = self.ax.get_xlim(), self.ax.get_ylim()
        x = (_x([at])[0] - x0) / (x1 - x0)
        y = (value - y0) / (y1 - y0)
        if any(abs(x - px) < WORDS_APART[0] and abs(y - py) < WORDS_APART[1] for px, py in self.placed):
            return
        self.placed.append((x, y))
        self.ax.annotate(f"{format_size(value, long=True)} at {_clock(at)}", (_x([at])[0], value), xytext=(0, 7),
                         textcoords="offset points", ha="center", va="bottom", fontsize=8, color=colour, zorder=6,
                         annotation_clip=False)


def _processes(data: PlotData, rss_ax: Axes, vram_ax: Axes | None) -> None:
    for p in sorted(data.processes, key=lambda p: p.colour is not None):  # the coloured ones on top
        named, colour = p.colour is not None, _colour(p)
        label = None
        if named:
            when = f" at {_clock(p.peak_time)}" if p.peak_time is not None else ""
            label = f"{_text(p.title)} ({p.pid}) · peak {format_size(p.peak_bytes, long=True)}{when}"
        _line(rss_ax, p.rss, f"rss-{p.pid}", colour, 1.6 if named else 0.8, label, data.gap_seconds)
        if p.peak_time is not None:
            _mark(rss_ax, p.peak_time, p.peak_bytes, f"peak-{p.pid}", colour, "v", named)
        if p.exited_at is not None and p.last_rss is not None:
            _mark(rss_ax, p.exited_at, p.last_rss, f"exit-{p.pid}", colour, "X", named)
        if vram_ax is not None and p.vram:
            _line(vram_ax, p.vram, f"vram-{p.pid}", colour, 1.6 if named else 0.8, None, data.gap_seconds)
            if p.vram_peak_time is not None and p.vram_peak_bytes is not None:
                _mark(vram_ax, p.vram_peak_time, p.vram_peak_bytes, f"vram-peak-{p.pid}", colour, "v", named)


def _peak_words(data: PlotData, rss_ax: Axes, vram_ax: Axes | None) -> None:
    rss, vram = Words(rss_ax), Words(vram_ax) if vram_ax is not None else None
    for p in data.processes:  # highest RSS peak first
        if p.colour is not None and p.peak_time is not None:
            rss.add(p.peak_time, p.peak_bytes, _colour(p))
    if vram is not None:
        for p in sorted(data.processes, key=lambda p: p.vram_peak_bytes or 0, reverse=True):
            if p.colour is not None and p.vram_peak_time is not None and p.vram_peak_bytes is not None:
                vram.add(p.vram_peak_time, p.vram_peak_bytes, _colour(p))


def _box(data: PlotData, ax: Axes) -> None:
    """The Σ of the peaks over time, and the capacity they must fit in."""
    _line(ax, data.sum_peaks, "sum-peaks", SUM, 1.4, data.SUM_LABEL, data.gap_seconds, linestyle="--")
    if data.judged_sum_peaks:
        _line(ax, data.judged_sum_peaks, "sum-peaks-judged", SUM, 1.8, data.JUDGED_LABEL, data.judged_gap_seconds)
    if data.together:
        _line(ax, data.together, "seen-together", TOGETHER, 1.8, data.TOGETHER_LABEL, data.judged_gap_seconds)
    top = data.sum_top
    if data.show_capacity() and data.capacity_bytes is not None:
        line = ax.axhline(data.capacity_bytes, color="black", linewidth=1.2, linestyle="-.", zorder=4,
                          label=data.capacity_words())
        line.set_gid("capacity")
        top = max(top, data.capacity_bytes)
    _bytes_axis(ax, top, "Σ peaks", room=1.08)


def _alerts(data: PlotData, axes: Sequence[Axes]) -> None:
    labelled = data.labelled_alerts()
    for n, a in enumerate(data.alerts):
        colour = SEVERITY_COLOUR.get(a.severity, "#7f7f7f")
        style = "-" if a.state == AlertState.FIRING else ":"
        for i, ax in enumerate(axes):
            line = ax.axvline(_x([a.time])[0], color=colour, linestyle=style, linewidth=1.2, alpha=0.8, zorder=1)
            if i == 0:
                line.set_gid(f"alert-{n}")
        if labelled[n]:
            axes[0].annotate(_text(a.kind, 20), (_x([a.time])[0], 1.0), xycoords=("data", "axes fraction"),
                             xytext=(3, -3), textcoords="offset points", rotation=90, ha="left", va="top",
                             fontsize=7, color=colour)


def _bytes_axis(ax: Axes, top: int, what: str, room: float = 1.15) -> None:
    """Binary-unit ticks from 0; ``room`` above the data for the peaks' words."""
    ticks = binary_ticks(top)
    ax.set_ylim(0, max(ticks[-1], top * room))
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: tick_label(int(v))))
    ax.set_ylabel(what)
    ax.grid(True, color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)


def _legend_extras(data: PlotData) -> list[tuple[Line2D, str]]:
    extras: list[tuple[Line2D, str]] = []
    hidden = sum(p.colour is None for p in data.processes)
    if hidden:
        extras.append((Line2D([], [], color=OTHERS, linewidth=0.8), f"{hidden} more (lower peaks)"))
    if data.capacity_bytes is not None and not data.show_capacity():
        extras.append((Line2D([], [], linestyle="none"), f"{data.capacity_words()} (off the scale)"))
    extras.append((Line2D([], [], marker="v", color="#555555", linestyle="none"), "peak"))
    if any(p.exited_at is not None for p in data.processes):
        extras.append((Line2D([], [], marker="X", color="#555555", linestyle="none"), "exit"))
    for severity, colour in SEVERITY_COLOUR.items():
        if any(a.severity == severity for a in data.alerts):
            extras.append((Line2D([], [], color=colour), f"{severity} alert (dotted: resolved)"))
    return extras


def render(data: PlotData, fmt: str, size: tuple[int, int]) -> bytes:
    """The picture as ``fmt`` (``png`` or ``svg``) bytes, ``size`` pixels (at 100 dpi)."""
    # No path simplification: the series are decimated already (plot_data.decimate), and
    # an SVG path then has a vertex per point, as checked by the tests.
    with mpl.rc_context({"path.simplify": False, "svg.fonttype": "none", "svg.hashsalt": "memagent"}):
        fig = Figure(figsize=(size[0] / DPI, size[1] / DPI), dpi=DPI, layout="constrained")
        ratios = [1, 2, 1] if data.has_vram else [1, 2]
        axes = list(fig.subplots(len(ratios), 1, sharex=True, squeeze=False,
                                 gridspec_kw={"height_ratios": ratios})[:, 0])
        box_ax, rss_ax, vram_ax = axes[0], axes[1], (axes[2] if data.has_vram else None)
        _box(data, box_ax)
        _processes(data, rss_ax, vram_ax)
        _alerts(data, axes)
        _bytes_axis(rss_ax, data.rss_top, "RSS")
        if vram_ax is not None:
            _bytes_axis(vram_ax, data.vram_top, "GPU memory")
        ends = [data.first, data.last] + [p.exited_at for p in data.processes if p.exited_at is not None]
        lo, hi = _x([min(ends), max(ends)])
        pad = max((hi - lo) * 0.01, 1 / 86400)
        rss_ax.set_xlim(lo - pad, hi + pad)
        _peak_words(data, rss_ax, vram_ax)
        locator = mdates.AutoDateLocator()  # type: ignore[no-untyped-call]
        axes[-1].xaxis.set_major_locator(locator)
        axes[-1].xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
        fig.suptitle(title(data), fontsize=12)
        handles, labels = box_ax.get_legend_handles_labels()
        more_handles, more_labels = rss_ax.get_legend_handles_labels()
        handles += more_handles
        labels += more_labels
        for handle, text in _legend_extras(data):
            handles.append(handle)
            labels.append(text)
        fig.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False)
        out = io.BytesIO()
        fig.savefig(out, format=fmt, metadata={"Date": None} if fmt == "svg" else None)
    return out.getvalue()
