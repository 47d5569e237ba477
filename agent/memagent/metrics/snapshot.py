"""What the Prometheus exposition shows, taken from the agent's parts in one go.

:meth:`MetricsSnapshotSource.take` runs on the agent's event loop, between ticks, like every
other reader of its state: it copies the figures into immutable records
(:class:`MetricsSnapshot`), and :mod:`memagent.metrics.exposition` renders those, so nothing that
renders or writes the exposition ever touches a live :class:`~memagent.core.watched.Watched`.
Taking it costs one to two microseconds per process (bench/metrics_scrape.py).

Which processes: the live ones, and exited ones until ``[metrics] exited_ttl`` after their
exit (the registry keeps them longer, for ``ls``), so that the number of series stays
bounded under churn. A PID seen twice (an exited process and a new one under the reused
PID) is shown once, the live one, so that no scrape carries a duplicate series.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple, Protocol, TypeVar

from memproto.records import SAMPLE_COLUMNS
from memproto.version import PROTOCOL_VERSION
from memproto.vocabulary import AlertState

from .. import __version__
from ..alerting.engine import AlertEngine
from ..alerting.headroom import budgeted, contribution
from ..config import AgentConfig
from ..core.registry import Registry
from ..core.sampler import Ticker
from ..core.stack_collector import StackCollector
from ..core.watched import Watched


class ProcessFigures(NamedTuple):
    """One process (``per_process = "pid"``) or one label's processes together
    (``"label"``: ``pid`` 0 and ``name`` "", sums, ``peak_exact`` only if every one is).
    A named tuple: made 1000 times per scrape, three times faster than a frozen dataclass."""

    pid: int
    name: str
    label: str
    rss: int
    rss_peak: int
    #: None: unknown (no NVML, or no figure from the driver): the series is left out.
    vram: int | None
    vram_peak: int | None
    growth: float
    peak_exact: bool
    #: Seconds until its headroom is gone at its growth pace (inf: not growing).
    leak_eta: float = math.inf


@dataclass(frozen=True, slots=True)
class HeadroomFigures:
    resource: str
    #: For people (``host memory``, ``docker web``): ``memagent_headroom_resource_info``.
    name: str
    sum_peaks: int
    capacity: int
    #: None when the capacity is 0: the series is left out.
    ratio: float | None
    #: The highest total seen together (docs/headroom.md, "Two bounds"); None: none yet.
    observed_sum_max: int | None = None


@dataclass(frozen=True, slots=True)
class TickFigures:
    """The tick-duration histogram: bucket bounds, cumulative counts (the last: +Inf)."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    count: int
    total: float


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    per_label: bool
    processes: tuple[ProcessFigures, ...]
    headroom: tuple[HeadroomFigures, ...]
    #: (kind, resource, severity) of each firing alert.
    firing: tuple[tuple[str, str, str], ...]
    warn_fraction: float
    #: (label, bytes) of each configured budget, and the Σ peaks that budget is held to.
    budgets: tuple[tuple[str, int], ...]
    label_peaks: tuple[tuple[str, int], ...]
    watched: int
    tick: TickFigures
    stack_dumps: int
    version: str = __version__
    protocol: str = "{}.{}".format(*PROTOCOL_VERSION)


#: The figures of a process, from its sample-frame row (:attr:`Watched.row`, rebuilt by
#: every change): ~6 times cheaper than the properties that compute them (the peaks).
_FIGURES = itemgetter(*(SAMPLE_COLUMNS.index(c) for c in ("rss_bytes", "rss_peak_bytes", "vram_bytes",
                                                            "vram_peak_bytes", "rss_peak_exact")))


def process_figures(w: Watched, growth: float, leak_eta: float = math.inf) -> ProcessFigures:
    rss, peak, vram, vram_peak, exact = _FIGURES(w.row)
    return ProcessFigures(w.pid, w.name, w.label or "", rss, peak, vram, vram_peak, growth, exact, leak_eta)


def by_label(rows: Iterable[ProcessFigures]) -> tuple[ProcessFigures, ...]:
    """One row per label (processes without one together, under ""): sums, exact only
    when every process's peak is, and the soonest leak ETA of its processes."""
    groups: dict[str, list[ProcessFigures]] = {}
    for r in rows:
        groups.setdefault(r.label, []).append(r)
    out = []
    for label, rs in sorted(groups.items()):
        vram = [r.vram for r in rs if r.vram is not None]
        vram_peak = [r.vram_peak for r in rs if r.vram_peak is not None]
        out.append(ProcessFigures(
            0, "", label, sum(r.rss for r in rs), sum(r.rss_peak for r in rs), sum(vram) if vram else None,
            sum(vram_peak) if vram_peak else None, sum(r.growth for r in rs), all(r.peak_exact for r in rs),
            min(r.leak_eta for r in rs)))
    return tuple(out)


class Entry(Protocol):
    """What :func:`shown` reads of a process (a :class:`Watched`, or plain values in tests)."""

    @property
    def pid(self) -> int: ...
    @property
    def alive(self) -> bool: ...
    @property
    def exited_at(self) -> float | None: ...


E = TypeVar("E", bound=Entry)


def shown(entries: Iterable[E], now: float, ttl: float) -> list[E]:
    """The live processes and those exited less than ``ttl`` seconds ago, one per PID
    (the live one, else the latest to exit), in PID order."""
    best: dict[int, E] = {}
    for w in entries:
        if not w.alive and (w.exited_at is None or now - w.exited_at >= ttl):
            continue
        other = best.get(w.pid)
        if other is None or (w.alive, w.exited_at or 0.0) > (other.alive, other.exited_at or 0.0):
            best[w.pid] = w
    return [best[pid] for pid in sorted(best)]


@dataclass
class MetricsSnapshotSource:
    """The parts a snapshot is read from (the agent's own)."""

    config: AgentConfig
    registry: Registry
    alerts: AlertEngine
    ticker: Ticker
    stacks: StackCollector

    def take(self, now: float) -> MetricsSnapshot:
        """On the event loop: every figure copied, nothing kept that the tick changes."""
        m, rates, etas = self.config.metrics, self.alerts.rates, self.alerts.etas
        entries = list(self.registry.entries.values())
        rows = [process_figures(w, rates.get(w.key, 0.0), etas.get(w.key, math.inf))
                for w in shown(entries, now, m.exited_ttl)]
        budgets = tuple(sorted(self.config.alerts.budgets.items()))
        h = self.ticker.durations
        return MetricsSnapshot(
            per_label=m.per_process == "label",
            processes=by_label(rows) if m.per_process == "label" else tuple(rows),
            headroom=tuple(HeadroomFigures(v.resource, v.name, v.sum_peaks_bytes, v.capacity_bytes, v.ratio,
                                           v.observed_sum_max_bytes)
                           for v in self.alerts.headroom),
            firing=tuple(sorted((a.kind, a.resource, a.severity) for a in self.alerts.book.active.values()
                                if a.state == AlertState.FIRING)),
            warn_fraction=self.config.alerts.warn_fraction,
            budgets=budgets,
            label_peaks=tuple((label, sum(contribution(w) for w in budgeted(entries, label)))
                              for label, _ in budgets),
            watched=len(self.registry.alive),
            tick=TickFigures(h.bounds, h.cumulative(), h.count, h.total),
            stack_dumps=self.stacks.dumps_started,
        )
