"""memtop's data layer: frames in, immutable snapshots out (nvitop's api/ idea).

:class:`FleetModel` is fed every frame from the daemon and keeps what the screen needs:
per-process latest values, a short window for the growth rate and a longer history for
the chart. :meth:`FleetModel.snapshot` returns an immutable :class:`Snapshot` that the
widgets only read. "Not available" is ``None`` (shown as n/a), never 0 and never an
exception.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field, replace

from memproto.frames import DaemonStatus, ProcessInfo, Sample, Series

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

    @property
    def key(self) -> Key:
        return (self.pid, self.start_time)

    @property
    def display_name(self) -> str:
        return self.label or self.name

    def matches(self, needle: str) -> bool:
        needle = needle.lower()
        return (
            needle in str(self.pid)
            or needle in self.name.lower()
            or needle in (self.label or "").lower()
            or needle in " ".join(self.cmdline).lower()
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


@dataclass(slots=True)
class _Proc:
    row: ProcRow
    recent: deque[tuple[float, int]] = field(default_factory=deque)
    history: deque[tuple[float, int]] = field(default_factory=deque)


def _slope(points: deque[tuple[float, int]]) -> float | None:
    """Least-squares slope (bytes/s) of ``(time, rss)`` points spanning at least 2 s."""
    if len(points) < 3 or points[-1][0] - points[0][0] < 2.0:
        return None
    n = len(points)
    t0 = points[0][0]
    mt = sum(t - t0 for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    num = sum((t - t0 - mt) * (v - mv) for t, v in points)
    den = sum((t - t0 - mt) ** 2 for t, _ in points)
    return num / den if den > 0 else None


def _row_from_info(p: ProcessInfo) -> ProcRow:
    return ProcRow(
        pid=p.pid, start_time=p.start_time, name=p.name, label=p.label, cmdline=tuple(p.cmdline),
        uid=p.uid, alive=p.alive, rss=p.rss_bytes, peak=p.rss_peak_bytes, anon=p.anon_bytes,
        swap=p.swap_bytes, peak_exact=p.rss_peak_exact,
    )


class FleetModel:
    """Mutable state, owned by the UI thread; fed frames, produces snapshots."""

    def __init__(self) -> None:
        self._procs: dict[Key, _Proc] = {}
        self.seq = 0
        self.time = 0.0
        self.interval = 0.0
        self.host: HostMem | None = None
        self.dropped = 0

    def clear(self) -> None:
        self._procs.clear()

    # ------------------------------------------------------------------ frames in

    def set_processes(self, processes: list[ProcessInfo]) -> None:
        """A full list (after connecting): replaces what was known."""
        old = self._procs
        self._procs = {}
        for p in processes:
            self.upsert(p)
            prev = old.get((p.pid, p.start_time))
            if prev is not None:
                self._procs[(p.pid, p.start_time)].history = prev.history

    def upsert(self, p: ProcessInfo) -> None:
        key = (p.pid, p.start_time)
        proc = self._procs.get(key)
        if proc is None:
            self._procs[key] = _Proc(_row_from_info(p))
        else:
            proc.row = _row_from_info(p)

    def remove(self, pid: int, start_time: float) -> None:
        self._procs.pop((pid, start_time), None)

    def mark_exited(self, pid: int, start_time: float, peak: int) -> None:
        proc = self._procs.get((pid, start_time))
        if proc is not None:
            proc.row = replace(proc.row, alive=False, peak=max(proc.row.peak, peak), growth=None)

    def apply_history(self, step: float, series: list[Series]) -> None:
        for s in series:
            proc = self._procs.get((s.pid, s.start_time))
            if proc is None or not s.rss_bytes:
                continue
            first = s.end_time - step * len(s.rss_bytes)
            points = [(first + step * (i + 1), v) for i, v in enumerate(s.rss_bytes)]
            newer = [pt for pt in proc.history if pt[0] > points[-1][0]]
            proc.history = deque(points + newer)

    def apply_sample(self, sample: Sample) -> None:
        self.seq = sample.seq
        self.time = sample.time
        self.interval = sample.interval
        now = sample.time
        horizon_recent = now - GROWTH_WINDOW
        horizon_history = now - HISTORY_SECONDS
        for rec in sample.records():
            proc = self._procs.get((rec.pid, rec.start_time))
            if proc is None:
                continue  # attached event not seen yet; the list on connect fills it
            recent = proc.recent
            if rec.alive:
                recent.append((now, rec.rss_bytes))
                while recent and recent[0][0] < horizon_recent:
                    recent.popleft()
                history = proc.history
                history.append((now, rec.rss_bytes))
                while history and history[0][0] < horizon_history:
                    history.popleft()
            proc.row = replace(
                proc.row,
                alive=rec.alive,
                rss=rec.rss_bytes,
                peak=rec.rss_peak_bytes,
                anon=rec.anon_bytes,
                swap=rec.swap_bytes,
                growth=_slope(recent) if rec.alive else None,
            )

    def apply_status(self, status: DaemonStatus) -> None:
        self.host = HostMem(status.host.total_bytes, status.host.available_bytes)
        self.interval = status.interval

    # ------------------------------------------------------------------ snapshots out

    def history(self, key: Key | None) -> list[tuple[float, int]]:
        proc = self._procs.get(key) if key else None
        return list(proc.history) if proc else []

    def snapshot(self) -> Snapshot:
        rows = [p.row for p in self._procs.values()]
        total = sum(r.peak for r in rows)
        if total:
            rows = [replace(r, share=r.peak / total) for r in rows]
        return Snapshot(tuple(rows), self.seq, self.time, self.interval, self.host, total, self.dropped)


# ---------------------------------------------------------------------- sorting

#: Sort keys by column; the first is the default ("peak offenders first").
SORTS: dict[str, tuple[str, bool]] = {
    "peak": ("peak", True),
    "rss": ("rss", True),
    "growth": ("growth", True),
    "share": ("share", True),
    "pid": ("pid", False),
    "name": ("name", False),
    "vram": ("vram", True),
    "vram_peak": ("vram_peak", True),
}


def sort_rows(rows: tuple[ProcRow, ...] | list[ProcRow], column: str, reverse: bool = False) -> list[ProcRow]:
    """Sorted view; ``None`` values sort last whichever the direction."""
    if column == "name":
        def name_key(r: ProcRow) -> tuple[str, int]:
            return (r.display_name.lower(), r.pid)
        return sorted(rows, key=name_key, reverse=reverse)
    present = [r for r in rows if getattr(r, column) is not None]
    missing = [r for r in rows if getattr(r, column) is None]
    present.sort(key=lambda r: (getattr(r, column), -r.pid), reverse=SORTS[column][1] != reverse)
    return present + sorted(missing, key=lambda r: r.pid)


def bucket_max(points: list[tuple[float, int]], start: float, end: float, buckets: int) -> list[int | None]:
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
