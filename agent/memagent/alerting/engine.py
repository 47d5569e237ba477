"""Each tick: the headroom of the host, each GPU and each limited memory cgroup, and the
alerts that follow from it.

Runs right after the memory and GPU sample of the tick, so an alert reaches its hook
within one interval of the crossing. Kinds: ``headroom`` (host, each GPU, each cgroup
limit: :mod:`.limits`),
``pressure`` (memory PSI), ``leak`` (sustained growth, with the time until the headroom
is gone), ``budget`` (a label's Σ peaks over its configured budget) and ``oom-kill``.
PSS, which the host Σ needs, is read off the tick in a worker thread and rarely.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from memproto.records import Alert, Contributor, Headroom
from memproto.text import printable
from memproto.units import format_size
from memproto.vocabulary import AlertKind, AlertState, OomSource, Resource, Severity

from ..config import AlertConfig, HeadroomConfig, copy_live
from ..core.registry import Registry
from ..core.watched import Watched
from ..errors import MemagentError
from ..proc.cgroup_identity import cgroup_path
from ..proc.cgroups import ROOT, ancestors, oom_kill_count
from ..proc.kmsg import KernelLog
from ..proc.nvml import DeviceReading
from ..proc.procfs import ProcFS
from .book import AlertBook, Reading
from .growth import growth, judge
from .headroom import HostInputs, budgeted, contribution, gpu_headroom, host_headroom
from .limits import CgroupLimits
from .observed import HighestTogether
from .oom_standing import Contender, Standing, standing
from .sharing import SharingTracker

log = logging.getLogger(__name__)

LEAK_EVERY = 5.0
CGROUP_EVERY = 10.0
PSS_GRACE = 10.0


SIGKILL = 9


class AlertEngine:
    def __init__(self, registry: Registry, headroom: HeadroomConfig, alerts: AlertConfig,
                 deliver: Callable[[Alert], None], stack_text: Callable[[Watched], str | None],
                 kmsg: KernelLog | None = None, cgroup_root: str = ROOT) -> None:
        """``deliver`` sends an alert on its ways (log, clients, hook); ``stack_text`` gives
        the stack at a process's peak as text, for an oom-kill alert's details; ``kmsg`` is
        the kernel log to read OOM kills from (None: ``/dev/kmsg``); ``cgroup_root`` where
        the cgroup file systems are (a fixture tree in tests)."""
        self.registry = registry
        self.procfs: ProcFS = registry.procfs
        self.headroom_config = headroom
        self.config = alerts
        self.book = AlertBook(alerts.hysteresis, alerts.recent, deliver)
        self.stack_text = stack_text
        self.kmsg = kmsg if kmsg is not None else KernelLog()
        self.headroom: list[Headroom] = []
        self.pressure: float | None = None
        self.limits = CgroupLimits(registry, cgroup_root)
        self._next_cgroup = 0.0
        self._next_leak = 0.0
        #: Per live process (its key), the growth rate (bytes/s) the last leak check found
        #: since its latest low (0: not growing); memagent_process_growth_bytes_per_second.
        self.rates: dict[tuple[int, int], float] = {}
        #: Per live process (its key), the seconds until the headroom it is in (the host's,
        #: or its limited cgroup's) is gone at that rate, as the last leak check found
        #: (inf: not growing); memagent_process_leak_eta_seconds.
        self.etas: dict[tuple[int, int], float] = {}
        self.sharing = SharingTracker(registry, headroom)
        #: Per resource, the highest total seen together (the observed bound, :mod:`.observed`);
        #: the agent gives it what the state directory kept (:meth:`take_back`).
        self.together = HighestTogether()
        self._state: tuple[int, int] = (-1, -1)
        self._devices: list[DeviceReading] | None = None
        self._next_full = 0.0

    # ------------------------------------------------------------------ per tick

    def on_tick(self, now: float, exited: list[Watched], devices: list[DeviceReading], changed: bool = True,
                moved: Sequence[Watched] = ()) -> None:
        """``moved``: the processes whose memory the sampler re-read this tick."""
        alive = self.registry.alive
        self.sharing.on_tick(now, moved)
        if now >= self._next_cgroup:
            self._next_cgroup = now + CGROUP_EVERY
            self._oom_counts(alive)
        self.kmsg.poll(now)
        for w in exited:
            self._oom(w, now)
        # The sums only move when a process's memory, the set of processes or a PSS read
        # changed; otherwise once a second (for what unwatched processes use).
        state = (self.registry.version, self.sharing.reads)
        if not changed and devices is self._devices and state == self._state and now < self._next_full:
            return
        self._state, self._devices, self._next_full = state, devices, now + 1.0
        watched = list(self.registry.entries.values())
        mem = self.procfs.meminfo()
        unified = any(d.unified for d in devices)
        host = host_headroom(HostInputs(mem.get("MemTotal", 0), mem.get("MemAvailable", 0), unified=unified),
                             watched, self.headroom_config)
        self.sharing.on_unwatched(now, host.unwatched_bytes)
        views = [host]
        gpu_views = [gpu_headroom(d, watched, self.headroom_config) for d in devices if not d.lost and d.total]
        views += gpu_views
        self.limits.refresh(now, mem.get("MemTotal", 0))
        views += self.limits.views(now, watched)
        # A process just attached counts its shared pages in full until its PSS is read
        # (within a tick or two): judging the host (or a cgroup it is in) before that
        # would raise false alarms for forked workers, and its total now would be an
        # observed maximum too high. Not for long: at most PSS_GRACE s.
        unsure = {w.key for w in alive if not w.share_known and now - w.attached_at < PSS_GRACE}
        views = [self._observed(v, now, bool(unsure) and self._share_adjusted(v.resource, unsure)) for v in views]
        self.headroom = views
        for view in views:
            if view.ratio is not None and not (unsure and self._share_adjusted(view.resource, unsure)):
                self._judge(view, view.ratio)
        for resource in self.book.resources(AlertKind.HEADROOM) - {v.resource for v in views}:
            gone = "has no limit or no watched process any more" if resource.startswith(Resource.CGROUP_PREFIX) \
                else "is no longer sampled"
            self.book.clear(AlertKind.HEADROOM, resource, f"resolved: {printable(resource)} {gone}")
        self._pressure()
        self._budgets(watched, unified)
        if now >= self._next_leak:
            self._next_leak = now + LEAK_EVERY
            self._leaks(now, host)

    def apply(self, headroom: HeadroomConfig, alerts: AlertConfig) -> None:
        """A reload: the new thresholds, capacity and budgets, in place (the sharing
        tracker holds the same headroom config); a budget no longer set resolves its alert."""
        copy_live(self.headroom_config, headroom)
        copy_live(self.config, alerts)
        self.book.apply(self.config.hysteresis, self.config.recent)
        for label in self.book.resources(AlertKind.BUDGET) - set(self.config.budgets):
            self.book.clear(AlertKind.BUDGET, label, f"resolved: label '{printable(label)}' has no budget any more")

    def take_back(self, together: HighestTogether) -> None:
        """The observed maxima the state directory kept across a restart."""
        self.together = together

    def _observed(self, view: Headroom, now: float, unsure: bool) -> Headroom:
        """``view`` with the observed maximum; its total now is folded in unless a process
        in it is not share-adjusted yet (then it is not a figure to keep: it says nothing now)."""
        if unsure:
            view = replace(view, sum_now_bytes=None, now_top=[])
        return self.together.marked(view, now)

    # ------------------------------------------------------------------ kinds

    def _share_adjusted(self, resource: str, unsure: set[tuple[int, int]]) -> bool:
        """Whether ``resource``'s Σ counts a process in ``unsure`` share-adjusted: the
        host's counts every process, a cgroup's its own; a GPU's is not share-adjusted."""
        if resource == Resource.HOST:
            return True
        return any(w.key in unsure for w in self.limits.members.get(resource, ()))

    def _judge(self, view: Headroom, ratio: float) -> None:
        c = self.config
        figures = (f"Σ peaks {_size(view.sum_peaks_bytes)} would use {ratio:.0%} of the "
                   f"{_size(view.capacity_bytes)} headroom")
        subject = self.limits.subjects.get(view.resource)
        if view.resource == Resource.HOST:
            message = f"{figures} of host memory"
        elif subject is not None:  # a cgroup's limit: named first, as people know it
            message = f"{printable(subject)}: {figures} of its {_size(view.limit_bytes)} limit"
        else:
            message = f"{figures} of {printable(view.name)}"
        # Both bounds (docs/headroom.md, "Two bounds"): the worst case judged, the observed beside it.
        if view.observed_sum_max_bytes is not None and view.capacity_bytes:
            seen = view.observed_sum_max_bytes
            message += f"; seen together at most {_size(seen)} ({seen / view.capacity_bytes:.0%})"
        self.book.evaluate(Reading(AlertKind.HEADROOM, view.resource, ratio, c.warn_fraction,
                                   c.critical_fraction, "ratio", message, view.top))

    def _pressure(self) -> None:
        self.pressure = self.procfs.memory_pressure()
        if self.pressure is None:
            return
        t = self.config.pressure_threshold
        self.book.evaluate(Reading(AlertKind.PRESSURE, "host", self.pressure, t, min(100.0, 3 * t), "percent",
                                   f"memory pressure: tasks stalled on memory {self.pressure:.1f}% of the "
                                   f"last 10 s", []))

    def _budgets(self, watched: list[Watched], unified: bool) -> None:
        """Each label's Σ peaks against its budget; on a unified-memory board (a Jetson read
        through nvmap) a process's GPU memory peak counts with its RSS peak, as the host's
        headroom counts it there (docs/gpu.md)."""

        def peak(w: Watched) -> int:
            return contribution(w) + ((w.vram_peak or 0) if unified else 0)

        for label, budget in self.config.budgets.items():
            mine = budgeted(watched, label)
            total = sum(peak(w) for w in mine)
            top = [Contributor(w.pid, label, peak(w)) for w in sorted(mine, key=peak, reverse=True)]
            self.book.evaluate(Reading(
                AlertKind.BUDGET, label, total / budget if budget else 0.0, 1.0, 1.25, "ratio",
                f"label '{printable(label)}': Σ peaks {_size(total)} of a {_size(budget)} budget", top[:5],
            ))

    def _leaks(self, now: float, host: Headroom) -> None:
        """Each live process's growth since its latest low, judged by :mod:`.growth`,
        against what is left of the tightest headroom it is in: the host's, or a limited
        cgroup's."""
        c = self.config
        host_left = max(0, host.capacity_bytes - host.sum_peaks_bytes)
        lefts: dict[tuple[int, int], int] = {}
        for view in self.headroom:
            for w in self.limits.members.get(view.resource, ()):
                lefts[w.key] = min(lefts.get(w.key, host_left), max(0, view.capacity_bytes - view.sum_peaks_bytes))
        step = self.registry.history_step
        # The most growth that can be waited for: the window, within the history kept.
        slots = min(max(1, int(c.leak_window / step + 0.999999)), self.registry.history_slots)
        longest = (slots - 1) * step
        live = set()
        self.rates = {}
        self.etas = {}
        for w in self.registry.alive:
            resource = f"pid:{w.pid}"
            live.add(resource)
            g = growth(w.history.series(c.leak_window)[1], w.history.step)
            v = judge(g, lefts.get(w.key, host_left), c.leak_min_rate, c.leak_horizon, longest)
            self.rates[w.key] = max(0.0, g.rate) if g is not None else 0.0
            self.etas[w.key] = v.eta if v.eta is not None else math.inf
            name = w.display
            if g is None or v.eta is None:
                message = f"{printable(name)} ({w.pid}) is not growing"
            else:
                # New memory is the process's own (anonymous, unshared): the growth counts
                # in full, whatever share of its older pages it shares with others.
                left = ("the headroom is already gone" if v.eta <= 0 else
                        f"the headroom is gone in {_duration(v.eta)} at this pace")
                message = (f"{printable(name)} ({w.pid}) grows {_size(int(v.per_minute))}/min over the last "
                           f"{g.seconds:g} s; {left}")
            critical = v.per_minute if v.leaking and v.eta is not None and v.eta <= c.leak_horizon / 6 else float("inf")
            self.book.evaluate(Reading(
                AlertKind.LEAK, resource, v.per_minute if v.leaking else 0.0, float(c.leak_min_rate), critical,
                "bytes/min", message, [Contributor(w.pid, name, contribution(w))], pid=w.pid, eta_seconds=v.eta,
            ))
        for resource in self.book.resources(AlertKind.LEAK) - live:
            self.book.clear(AlertKind.LEAK, resource, f"resolved: {resource} is no longer alive")

    def _oom(self, w: Watched, now: float) -> None:
        source = None
        if w.pid in self.kmsg.killed:
            source = OomSource.KERNEL_LOG
        else:
            count = oom_kill_count(w.cgroup, self.limits.root)
            if count is not None and w.oom_count is not None and count > w.oom_count:
                source = OomSource.CGROUP
            elif w.exit_signal == SIGKILL and self._memory_was_high(w):
                source = OomSource.INFERRED
        if source is None:
            return
        name = w.display
        _, values = w.history.series(30)
        last = ", ".join(_size(v) for v in values[-10:])
        stack = self.stack_text(w)
        domain, where = self._domain(w)
        stood = standing(self._victim(w), [self._contender(o) for o in domain], where[1])
        details = f"last RSS per second: {last}" + (f"\n{stack}" if stack else "")
        spared = stood.spared
        self.book.event(Alert(
            id=0, kind=AlertKind.OOM_KILL, state=AlertState.FIRING, severity=Severity.CRITICAL, resource=f"pid:{w.pid}",
            value=float(w.peak), threshold=0.0, unit="bytes", time=now, pid=w.pid, source=source,
            message=f"{printable(name)} ({w.pid}) was killed by the OOM killer"
                    + (" (inferred: SIGKILL at high memory)" if source == OomSource.INFERRED else "")
                    + f"; its peak was {_size(w.peak)}" + _standing_text(stood, len(domain), where[0]),
            contributors=[Contributor(w.pid, name, w.peak)], details=details, oom_highest=stood.highest,
            spared=None if spared is None else Contributor(spared.w.pid, spared.w.display, spared.w.peak),
        ))

    def _domain(self, w: Watched) -> tuple[list[Watched], tuple[str, int]]:
        """The other live watched processes of ``w``'s memory domain (its tightest limited
        cgroup, else the host), and the domain: its name and what it may use (bytes)."""
        homes = [c for c in self.limits.limits if w.cgroup is not None and c in _ancestry(w.cgroup)]
        if homes:
            home = min(homes, key=lambda c: self.limits.limits[c])
            others = [o for o in self.registry.alive if o is not w and o.cgroup is not None
                      and home in _ancestry(o.cgroup)]
            return others, (f"cgroup {printable(cgroup_path(home) or '/')}", self.limits.limits[home])
        mem = self.procfs.meminfo()
        total = mem.get("MemTotal", 0) + mem.get("SwapTotal", 0)
        return [o for o in self.registry.alive if o is not w], ("the host", total)

    def _victim(self, w: Watched) -> Contender:
        """The victim as the kernel's line says it was weighed, else its last sample and the
        value this daemon set (None: not known)."""
        said = self.kmsg.victims.get(w.pid)
        if said is not None:
            return Contender(w, said.rss_bytes + w.swap, said.oom_score_adj)
        return Contender(w, w.rss + w.swap, w.oom_score_adj)

    @staticmethod
    def _contender(w: Watched) -> Contender:
        try:
            adj: int | None = w.handle.oom_score_adj()
        except MemagentError:  # gone too, or unreadable: not known
            adj = None
        return Contender(w, w.rss + w.swap, adj)

    def _memory_was_high(self, w: Watched) -> bool:
        """The box, or a limited cgroup it was in, was short of memory when it died: the
        headroom near full, or memory pressure (a plain ``kill -9`` on a relaxed box is not
        an OOM kill)."""
        mine = [h for h in self.headroom
                if h.resource == Resource.HOST or any(m is w for m in self.limits.members.get(h.resource, ()))]
        ratio = max((h.ratio or 0.0 for h in mine), default=0.0)
        return ratio >= self.config.warn_fraction or (self.pressure or 0) >= self.config.pressure_threshold

    # ------------------------------------------------------------------ cgroups and PSS

    def _oom_counts(self, alive: list[Watched]) -> None:
        """Keep each process's view of its cgroup's OOM-kill counter recent, so that only a
        kill since the last look is blamed on its exit."""
        counts: dict[str | None, int | None] = {}
        for w in alive:
            if w.cgroup not in counts:
                counts[w.cgroup] = oom_kill_count(w.cgroup, self.limits.root)
            w.oom_count = counts[w.cgroup]

    async def pss_settled(self) -> None:
        """Wait until the PSS reads in flight, if any, are done (they run off the tick)."""
        await self.sharing.settled()

    def close(self) -> None:
        self.kmsg.close()




def _ancestry(cgroup: str) -> set[str]:
    return set(ancestors(cgroup))


def _standing_text(stood: Standing, others: int, domain: str) -> str:
    """The victim's standing, for the alert's message (nothing where nothing is known)."""
    if not others:
        return ""
    text = ""
    if stood.highest is not None:
        text = (f"; it had the highest OOM score of the {others + 1} watched processes in {domain}" if stood.highest
                else f"; it did not have the highest OOM score of the {others + 1} watched processes in {domain}")
    if stood.spared is not None:
        s = stood.spared
        adj = "" if s.oom_score_adj is None else f", oom_score_adj {s.oom_score_adj}"
        text += (f"; spared {printable(s.w.display)} ({s.w.pid}), the largest there at {_size(s.bytes)}{adj}")
    return text


def _size(n: int | None) -> str:
    return format_size(n, long=True)


def _duration(seconds: float) -> str:
    """Hours from two hours, minutes from one minute, else whole seconds (a few seconds
    shown as "0.0 min" read as "already gone" when it was not: issue 28)."""
    if seconds >= 7200:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{max(1, round(seconds))} s"
