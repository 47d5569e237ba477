"""Recordings for the ``memagent plot`` tests, written with the format's own writer
(:class:`memproto.recording.SegmentWriter`) as the daemon's recorder writes them: the
header, an ``attached`` frame per process, a headroom snapshot, whole then change-only
samples, an exit, alerts. The values are chosen so that each series has a known lowest
and highest point (the SVG test maps them back through the axis)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from memproto.frames import AlertRaised, Attached, Exited
from memproto.recording import FORMAT_VERSION, HeadroomSnapshot, SegmentHeader, SegmentWriter
from memproto.records import Alert, Contributor, Headroom, HostMemory, ProcessInfo
from memproto.version import PROTOCOL_MAJOR, PROTOCOL_MINOR

MiB = 1024 * 1024
GiB = 1024 * MiB
#: 2025-11-30 14:00:00 UTC.
T0 = 1_764_511_200.0
INTERVAL = 0.5


@dataclass
class Proc:
    """A process of a recording: ``rss(i)`` its RSS at tick ``i``, ``vram(i)`` its GPU memory."""

    pid: int
    name: str
    rss: Callable[[int], int]
    label: str | None = None
    cmdline: list[str] = field(default_factory=list)
    vram: Callable[[int], int | None] = lambda i: None
    exits_at: int | None = None  # the tick of its exit (no longer alive from then on)
    start_time: float = T0 - 100.0


@dataclass
class Written:
    path: Path
    ticks: int
    alerts: list[Alert]
    peaks: dict[int, tuple[int, float]]  # pid -> (peak bytes, first time at it)


def info(p: Proc) -> ProcessInfo:
    return ProcessInfo(pid=p.pid, start_time=p.start_time, name=p.name, cmdline=p.cmdline or [p.name],
                       label=p.label, uid=0, alive=True, attached_at=T0 - 50, exited_at=None,
                       rss_bytes=p.rss(0), rss_peak_bytes=p.rss(0), anon_bytes=p.rss(0), swap_bytes=0)


def alert(n: int, tick: int, kind: str, state: str, severity: str, pid: int | None = None) -> Alert:
    return Alert(id=n, kind=kind, state=state, severity=severity, resource="host" if pid is None else f"pid:{pid}",
                 value=0.9, threshold=0.8, message=f"{kind} {state}", time=T0 + tick * INTERVAL,
                 contributors=[Contributor(pid=pid or 1, label="x", peak_bytes=GiB)], unit="ratio", pid=pid)


def write_recording(path: Path, procs: Sequence[Proc], ticks: int, *, alerts: Sequence[tuple[int, Alert]] = (),
                    capacity: int | None = 2 * GiB, host: str = "testbox", batch_every: int = 20) -> Written:
    """``ticks`` samples of ``procs`` at :data:`INTERVAL` from :data:`T0`, into one segment."""
    header = SegmentHeader(format=FORMAT_VERSION, host=host, start_time=T0, interval=INTERVAL,
                           version=[PROTOCOL_MAJOR, PROTOCOL_MINOR], software="memagent test", source="client",
                           mem_total_bytes=capacity)
    w = SegmentWriter(header)
    out = bytearray(w.header_bytes())
    for p in procs:
        w.add(Attached(info(p)))
    if capacity is not None:
        host_mem = HostMemory(total_bytes=capacity, available_bytes=capacity // 2, swap_total_bytes=0,
                              swap_free_bytes=0)
        w.add(HeadroomSnapshot(time=T0, host=host_mem, headroom=[Headroom(
            resource="host", name="host", capacity_bytes=capacity, sum_peaks_bytes=GiB, ratio=0.25,
            limit_bytes=capacity, reserve_bytes=0, unwatched_bytes=0, configured=False, top=[])]))
    peak: dict[int, int] = {}
    vpeak: dict[int, int | None] = {}
    first_at: dict[int, float] = {}
    pending = dict(alerts)
    for i in range(ticks):
        now = T0 + i * INTERVAL
        rows = []
        for p in procs:
            alive = p.exits_at is None or i < p.exits_at
            rss = p.rss(min(i, p.exits_at - 1) if p.exits_at is not None else i)
            if alive and rss > peak.get(p.pid, -1):
                peak[p.pid], first_at[p.pid] = rss, now
            vram = p.vram(i) if alive else None
            if vram is not None:
                vpeak[p.pid] = max(vpeak.get(p.pid) or 0, vram)
            rows.append([p.pid, p.start_time, alive, rss, peak[p.pid], rss, 0, vram, vpeak.get(p.pid), True, None])
            if p.exits_at == i:
                w.add(Exited(pid=p.pid, start_time=p.start_time, time=now, rss_peak_bytes=peak[p.pid]))
        w.add_sample(i + 1, now, INTERVAL, rows)
        if i in pending:
            w.add(AlertRaised(pending[i]))
        if w.pending_frames >= batch_every:
            out += w.take()
    out += w.take()
    path.write_bytes(bytes(out))
    return Written(path, ticks, [a for _, a in alerts], {pid: (peak[pid], first_at[pid]) for pid in peak})


# --------------------------------------------------------------------------- the fleet most tests draw

TRAINER, LOADER, IDLE = 4242, 4343, 4444
TICKS = 60


def _trainer(i: int) -> int:  # 100 MiB up to 1 GiB at tick 30, then down to 300 MiB
    if i <= 30:
        return 100 * MiB + (924 * MiB * i) // 30
    return 300 * MiB


def _loader(i: int) -> int:  # 100 MiB, 256 MiB at ticks 10-14, 150 MiB until its exit at tick 40
    return 256 * MiB if 10 <= i < 15 else (100 * MiB if i < 10 else 150 * MiB)


def fleet(label: str = "trainer", cmdline: list[str] | None = None) -> list[Proc]:
    return [
        Proc(TRAINER, "python3", _trainer, label=label, cmdline=cmdline or ["python3", "train.py"],
             vram=lambda i: (i * 64 * MiB if i <= 30 else GiB)),
        Proc(LOADER, "loader", _loader, exits_at=40),
        Proc(IDLE, "idle", lambda i: 50 * MiB),
    ]


FLEET_ALERTS = [
    (25, alert(1, 25, "headroom", "firing", "warning")),
    (35, alert(1, 35, "headroom", "resolved", "warning")),
    (40, alert(2, 40, "oom-kill", "firing", "critical", pid=LOADER)),
]


def write_fleet(path: Path, **kw: object) -> Written:
    return write_recording(path, fleet(**kw), TICKS, alerts=FLEET_ALERTS)  # type: ignore[arg-type]
