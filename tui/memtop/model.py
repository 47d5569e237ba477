"""memtop's data layer: frames in, immutable snapshots out (nvitop's api/ idea).

:class:`FleetModel` is fed every frame from the daemon and keeps what the screen needs:
per-process latest values, a short window for the growth rate and a longer history for
the chart. :meth:`FleetModel.snapshot` returns an immutable :class:`Snapshot` that the
widgets only read. "Not available" is ``None`` (shown as n/a), never 0 and never an
exception.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from memproto.frames import (
    AlertRaised,
    Attached,
    AttachOk,
    Detached,
    DetachOk,
    Dropped,
    Exited,
    Frame,
    HistoryOk,
    ListOk,
    ResetPeaksOk,
    Sample,
    StackOk,
    StackStateChanged,
    StatusOk,
)
from memproto.recording import HeadroomSnapshot, PeakStack, SegmentHeader, Thinned
from memproto.records import Alert, DaemonStatus, GpuInfo, Headroom, ProcessInfo, Series
from memproto.series import PeakSeries
from memproto.text import display_name, fuller_cmdline
from memproto.vocabulary import AlertKind, AlertState, StackState

if TYPE_CHECKING:
    from memproto.records import HostMemory, StackDump

MiB = 1024 * 1024

Key = tuple[int, float]

#: Seconds of recent samples used for the growth rate.
GROWTH_WINDOW = 60.0
#: Seconds of history kept for the chart.
HISTORY_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class ProcRow:
    pid: int
    start_time: float
    name: str
    label: str | None
    cmdline: tuple[str, ...]
    uid: int
    alive: bool
    rss: int
    peak: int
    anon: int
    swap: int
    peak_exact: bool
    #: Bytes per second over the recent window; None until enough samples.
    growth: float | None = None
    #: This process's peak as a fraction of the Σ of all peaks.
    share: float = 0.0
    #: Filled by later features (GPU memory, stacks); None: not available.
    vram: int | None = None
    vram_peak: int | None = None
    stack_state: str | None = None
    #: v1.7: its container (the name, else the ID's first 12 digits) and systemd unit.
    container: str | None = None
    unit: str | None = None
    #: v1.7: its PID inside its own PID namespace, where that differs from the host's.
    ns_pid: int | None = None
    #: v1.10: the oom_score_adj the daemon set from its ``[oom_score_adj]`` table; None: not set.
    oom_score_adj: int | None = None

    @property
    def key(self) -> Key:
        return (self.pid, self.start_time)

    @property
    def display_name(self) -> str:
        """How the process is named to a person (:func:`memproto.text.display_name`)."""
        return display_name(self.label, self.name, self.cmdline)

    def matches(self, needle: str) -> bool:
        needle = needle.lower()
        return (
            needle in str(self.pid)
            or needle in self.name.lower()
            or needle in (self.label or "").lower()
            or needle in " ".join(self.cmdline).lower()
            or needle in (self.container or "").lower()
            or needle in (self.unit or "").lower()
        )


@dataclass(frozen=True, slots=True)
class HostMem:
    total: int
    available: int

    @property
    def used(self) -> int:
        return max(0, self.total - self.available)


@dataclass(frozen=True, slots=True)
class Snapshot:
    rows: tuple[ProcRow, ...] = ()
    seq: int = 0
    time: float = 0.0
    interval: float = 0.0
    host: HostMem | None = None
    sum_peaks: int = 0
    dropped: int = 0
    gpus: tuple[GpuInfo, ...] = ()
    #: The daemon's headroom of the host (first) and each GPU; empty before its status.
    headroom: tuple[Headroom, ...] = ()
    alerts: tuple[Alert, ...] = ()
    #: Every process the daemon watches, this user's or not (its last status; None: not
    #: told): more than ``rows`` means the Σ peaks and headroom count others' processes too.
    watched_total: int | None = None

    @property
    def alive(self) -> int:
        return sum(1 for r in self.rows if r.alive)

    @property
    def exited(self) -> int:
        return len(self.rows) - self.alive

    def row(self, key: Key | None) -> ProcRow | None:
        for r in self.rows:
            if r.key == key:
                return r
        return None


@dataclass(frozen=True, slots=True)
class Detail:
    """What the detail pane shows of the selected process: its row, RSS history up to
    ``now`` and the last stack reply (None: not read yet)."""

    row: ProcRow | None = None
    points: tuple[tuple[float, int], ...] = ()
    now: float = 0.0
    stack: StackOk | None = None


class GrowthWindow:
    """Least-squares slope of RSS over about the last minute, in O(1) time and ~1 KB per
    process: points at least ``spacing`` seconds apart go into a fixed ring, and running
    sums are updated as points enter and leave (1000 processes at 4 Hz stay cheap).

    Values are kept in MiB and times relative to the first sample, so the sums stay far
    from float64's precision limit.
    """

    __slots__ = ("_count", "_head", "_last", "_origin", "_st", "_stt", "_stv", "_sv", "_t", "_v", "spacing")

    def __init__(self, seconds: float = GROWTH_WINDOW, spacing: float = 1.0) -> None:
        self.spacing = spacing
        size = max(3, int(seconds / spacing) + 1)
        self._t = array("d", bytes(8 * size))
        self._v = array("d", bytes(8 * size))
        self._head = 0
        self._count = 0
        self._origin: float | None = None
        self._last = -1e18
        self._st = self._sv = self._stt = self._stv = 0.0

    def add(self, now: float, rss: int) -> None:
        if self._origin is None:
            self._origin = now
        t = now - self._origin
        if t - self._last < self.spacing:
            return
        self._last = t
        v = rss / MiB
        size = len(self._t)
        i = self._head
        if self._count == size:  # the oldest point leaves the window
            ot, ov = self._t[i], self._v[i]
            self._st -= ot
            self._sv -= ov
            self._stt -= ot * ot
            self._stv -= ot * ov
        else:
            self._count += 1
        self._t[i], self._v[i] = t, v
        self._head = (i + 1) % size
        self._st += t
        self._sv += v
        self._stt += t * t
        self._stv += t * v

    def slope(self) -> float | None:
        """Bytes per second; None until 3 points span at least 2 s."""
        n = self._count
        if n < 3:
            return None
        size = len(self._t)
        oldest = self._t[(self._head - n) % size]
        newest = self._t[(self._head - 1) % size]
        if newest - oldest < 2.0:
            return None
        den = n * self._stt - self._st * self._st
        if den <= 1e-9:
            return None
        return (n * self._stv - self._st * self._sv) / den * MiB


class _Proc:
    """Mutable per-process state; :meth:`row` freezes it into a :class:`ProcRow`."""

    __slots__ = ("alive", "anon", "growth", "info", "oom_score_adj", "peak", "peak_exact", "rss", "stack_state", "swap",
                 "trail", "vram", "vram_peak")

    def __init__(self, info: ProcessInfo) -> None:
        self.growth = GrowthWindow()
        #: Peak-preserving RSS per second for the chart: 2.4 KB per process.
        self.trail = PeakSeries(1.0, int(HISTORY_SECONDS))
        self.info: ProcessInfo = info
        self.set_info(info)

    def set_info(self, p: ProcessInfo) -> None:
        # A replayed keyframe's copy of an exited process has its command line cut: keep the whole one.
        cmdline = fuller_cmdline(p.cmdline, self.info.cmdline)
        self.info = p if cmdline == p.cmdline else replace(p, cmdline=cmdline)
        self.take_memory(p.alive, p.rss_bytes, p.rss_peak_bytes, p.anon_bytes, p.swap_bytes, p.vram_bytes,
                         p.vram_peak_bytes, p.rss_peak_exact, p.oom_score_adj)
        self.stack_state = p.stack_state

    def take_memory(self, alive: bool, rss: int, peak: int, anon: int, swap: int, vram: int | None,
                    vram_peak: int | None, peak_exact: bool | None, oom_score_adj: int | None) -> None:
        """The figures a list entry and a sample row both carry. Values, not a record: a
        sample's rows are read by column (:meth:`FleetModel.apply_sample`), without a
        record a row.

        The peak's exactness changes without a new list (reset-peaks, an exit record): a
        v1.5 row carries it; an older agent's row has nil there, and the last list's
        flag stays."""
        self.alive = alive
        self.rss = rss
        self.peak = peak
        self.anon = anon
        self.swap = swap
        self.vram = vram
        self.vram_peak = vram_peak
        self.oom_score_adj = oom_score_adj
        if peak_exact is not None:
            self.peak_exact = peak_exact

    def row(self, share: float) -> ProcRow:
        p, c = self.info, self.info.container  # CONTAINER: the name, else the short ID Docker shows
        return ProcRow(
            p.pid, p.start_time, p.name, p.label, tuple(p.cmdline), p.uid, self.alive, self.rss, self.peak,
            self.anon, self.swap, self.peak_exact, self.growth.slope() if self.alive else None, share,
            self.vram, self.vram_peak, self.stack_state,
            None if c is None else c.name or c.id[:12], p.unit, p.ns_pid if p.ns_pid != p.pid else None,
            self.oom_score_adj,
        )


class FleetModel:
    """Mutable state, owned by the UI thread; fed frames, produces snapshots."""

    def __init__(self) -> None:
        self._procs: dict[Key, _Proc] = {}
        self.seq = 0
        self.time = 0.0
        self.interval = 0.0
        self.host: HostMem | None = None
        self.gpus: tuple[GpuInfo, ...] = ()
        self.dropped = 0
        #: Per UID, how many short-lived processes the recorder left out (``thinned``: the
        #: user held its share of the recorder); replay only.
        self.left_out: dict[int, int] = {}
        #: The last stack reply, for the selected process only (stacks are large).
        self.stack: StackOk | None = None
        self.headroom: tuple[Headroom, ...] = ()
        self.watched_total: int | None = None
        #: Firing alerts by id, and ended or one-off ones, newest first.
        self.alerts: dict[int, Alert] = {}
        self.recent_alerts: list[Alert] = []
        #: The stack at each process's peak, from a recording (memtop --replay).
        self.peak_stacks: dict[Key, StackDump] = {}

    # ------------------------------------------------------------------ frames in

    def apply(self, frame: Frame) -> bool:
        """Apply one frame, live or recorded, through :data:`FRAME_HANDLERS`; False for a
        frame type the model has no use for, which changes nothing. The live app and the
        replay both come here, so a frame type added to the table is seen by both."""
        handler = FRAME_HANDLERS.get(type(frame))
        if handler is None:
            return False
        handler(self, frame)
        return True

    def set_processes(self, processes: list[ProcessInfo]) -> None:
        """A full list (after connecting): replaces what was known, keeping the history
        and growth window of processes still listed."""
        old = self._procs
        self._procs = {}
        for p in processes:
            key = (p.pid, p.start_time)
            proc = old.get(key)
            if proc is None:
                self._procs[key] = _Proc(p)
            else:
                proc.set_info(p)
                self._procs[key] = proc

    def upsert(self, p: ProcessInfo) -> None:
        key = (p.pid, p.start_time)
        proc = self._procs.get(key)
        if proc is None:
            self._procs[key] = _Proc(p)
        else:
            proc.set_info(p)

    def remove(self, pid: int, start_time: float) -> None:
        self._procs.pop((pid, start_time), None)
        self.peak_stacks.pop((pid, start_time), None)

    def mark_exited(self, pid: int, start_time: float, peak: int) -> None:
        proc = self._procs.get((pid, start_time))
        if proc is not None:
            proc.alive = False
            proc.peak = max(proc.peak, peak)

    def apply_history(self, step: float, series: list[Series]) -> None:
        for s in series:
            proc = self._procs.get((s.pid, s.start_time))
            if proc is not None and s.rss_bytes:
                proc.trail.load(s.end_time, s.rss_bytes)

    def apply_sample(self, sample: Sample) -> None:
        self.seq = sample.seq
        self.time = sample.time
        self.interval = sample.interval
        now = sample.time
        procs = self._procs
        # By column, not Sample.records(): a record a row was half of a replay's time.
        c = sample.column_index()
        pid, start, alive_at, rss_at, peak, anon, swap = (c["pid"], c["start_time"], c["alive"], c["rss_bytes"],
                                                          c["rss_peak_bytes"], c["anon_bytes"], c["swap_bytes"])
        vram, vram_peak, exact, oom = c["vram_bytes"], c["vram_peak_bytes"], c["rss_peak_exact"], c["oom_score_adj"]
        for row in sample.rows:
            proc = procs.get((row[pid], float(row[start])))
            if proc is None:
                continue  # attached event not seen yet; the list on connect fills it
            alive, rss = row[alive_at], row[rss_at]
            if alive:
                proc.growth.add(now, rss)
                proc.trail.add(now, rss)
            proc.take_memory(alive, rss, row[peak], row[anon], row[swap], row[vram] if vram >= 0 else None,
                             row[vram_peak] if vram_peak >= 0 else None, row[exact] if exact >= 0 else None,
                             row[oom] if oom >= 0 else None)

    def apply_dropped(self, count: int) -> None:
        """The daemon's total of samples dropped for this client (it read too slowly)."""
        self.dropped = count

    def apply_thinned(self, uid: int, processes: int) -> None:
        """A recording's count of one user's processes it left out (recording.md)."""
        self.left_out[uid] = self.left_out.get(uid, 0) + processes

    def apply_stack_state(self, pid: int, start_time: float, state: str) -> None:
        proc = self._procs.get((pid, start_time))
        if proc is not None:
            proc.stack_state = state

    def apply_stack(self, reply: StackOk) -> None:
        self.stack = reply
        self.apply_stack_state(reply.pid, reply.start_time, reply.state)

    def stack_for(self, key: Key | None) -> StackOk | None:
        """The last stack reply for ``key``; else, in a replay, its recorded stack at peak
        (a recording has no replies: the pane shows what it can)."""
        s = self.stack
        if s is not None and key == (s.pid, s.start_time):
            return s
        dump = self.peak_stacks.get(key) if key is not None else None
        if dump is None or key is None:
            return None
        return StackOk(0, key[0], key[1], StackState.OK, None, None, dump, [], [])

    def apply_peak_stack(self, pid: int, start_time: float, dump: StackDump) -> None:
        """A recording's stack at a process's peak (``peak_stack``)."""
        if (pid, start_time) in self._procs:
            self.peak_stacks[(pid, start_time)] = dump

    def apply_headroom(self, host: HostMemory, headroom: list[Headroom]) -> None:
        """A recording's ``headroom`` frame: the part of a status it keeps."""
        self.host = HostMem(host.total_bytes, host.available_bytes)
        self.headroom = tuple(headroom)

    def apply_status(self, status: DaemonStatus) -> None:
        self.host = HostMem(status.host.total_bytes, status.host.available_bytes)
        self.interval = status.interval
        self.gpus = tuple(status.gpus)
        self.headroom = tuple(status.headroom)
        self.alerts = {a.id: a for a in status.alerts_active}
        self.recent_alerts = list(status.alerts_recent)
        self.watched_total = status.watched_total

    def apply_alert(self, alert: Alert) -> None:
        # An OOM kill is an event, not a condition: it goes straight to the recent ones.
        if alert.state == AlertState.FIRING and alert.kind != AlertKind.OOM_KILL:
            self.alerts[alert.id] = alert
            return
        self.alerts.pop(alert.id, None)
        self.recent_alerts.insert(0, alert)
        del self.recent_alerts[100:]

    def apply_segment(self, header: SegmentHeader) -> None:
        """A recording segment's header: the daemon's sample interval then."""
        self.interval = header.interval

    def _upsert_all(self, processes: list[ProcessInfo]) -> None:
        for p in processes:
            self.upsert(p)

    def _remove_detached(self, reply: DetachOk) -> None:
        for ref in reply.detached:
            self.remove(ref.pid, ref.start_time)

    # ------------------------------------------------------------------ snapshots out

    def history(self, key: Key | None) -> list[tuple[float, int]]:
        proc = self._procs.get(key) if key else None
        return proc.trail.points() if proc else []

    def detail(self, snapshot: Snapshot, key: Key | None) -> Detail:
        """The detail of ``key``: its row as ``snapshot`` shows it (frozen while paused),
        with the history and stack reply known now."""
        return Detail(snapshot.row(key), tuple(self.history(key)), snapshot.time, self.stack_for(key))

    def snapshot(self) -> Snapshot:
        procs = self._procs.values()
        total = sum(p.peak for p in procs)
        rows = tuple(p.row(p.peak / total if total else 0.0) for p in procs)
        return Snapshot(rows, self.seq, self.time, self.interval, self.host, total, self.dropped, self.gpus,
                        self.headroom, tuple(self.alerts.values()), self.watched_total)



_Handler = Callable[[FleetModel, Any], None]

#: What each frame type does to the model: events, the replies to memtop's requests, and
#: the frames only recordings carry (``docs/recording.md``). The one table, used live
#: (:meth:`memtop.app.MemtopApp.apply_frame`) and in replay (:mod:`memtop.replay_data`):
#: a new frame type is one entry here. What a reply does beyond the model (a failure
#: said, a request no longer in flight) is the app's.
FRAME_HANDLERS: dict[type[Frame], _Handler] = {
    Sample: FleetModel.apply_sample,
    ListOk: lambda m, f: m.set_processes(f.processes),
    HistoryOk: lambda m, f: m.apply_history(f.step, f.series),
    StatusOk: lambda m, f: m.apply_status(f.status),
    Attached: lambda m, f: m.upsert(f.process),
    Exited: lambda m, f: m.mark_exited(f.pid, f.start_time, f.rss_peak_bytes),
    Detached: lambda m, f: m.remove(f.pid, f.start_time),
    Dropped: lambda m, f: m.apply_dropped(f.count),
    StackOk: FleetModel.apply_stack,
    AlertRaised: lambda m, f: m.apply_alert(f.alert),
    StackStateChanged: lambda m, f: m.apply_stack_state(f.pid, f.start_time, f.state),
    AttachOk: lambda m, f: m._upsert_all(f.attached),
    ResetPeaksOk: lambda m, f: m._upsert_all(f.reset),
    DetachOk: FleetModel._remove_detached,
    HeadroomSnapshot: lambda m, f: m.apply_headroom(f.host, f.headroom),
    PeakStack: lambda m, f: m.apply_peak_stack(f.pid, f.start_time, f.dump),
    SegmentHeader: lambda m, f: m.apply_segment(f),
    Thinned: lambda m, f: m.apply_thinned(f.uid, f.processes),
}


def bucket_max(points: Sequence[tuple[float, int]], start: float, end: float, buckets: int) -> list[int | None]:
    """Max value per equal time bucket in [start, end); None where a bucket has no point."""
    out: list[int | None] = [None] * buckets
    if buckets <= 0 or end <= start:
        return out
    times = [t for t, _ in points]
    lo = bisect.bisect_left(times, start)
    width = (end - start) / buckets
    for t, v in points[lo:]:
        if t >= end:
            break
        i = min(buckets - 1, int((t - start) / width))
        cur = out[i]
        out[i] = v if cur is None or v > cur else cur
    return out
