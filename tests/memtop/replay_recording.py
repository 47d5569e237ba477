"""A small recording for ``memtop --replay``'s tests, written with the recorder's own
encoder (:class:`memproto.recording.SegmentWriter`), every time and value fixed.

Two segments of a daemon's flight recorder, one second apart per sample:

* ``trainer`` (PID 5001) climbs 20 MiB a second from 200 MiB, peaks at :data:`PEAK_BYTES`
  at :data:`PEAK_TIME`, then falls to 300 MiB; its stack at the peak is recorded;
* ``exporter`` (PID 5002) holds 150 MiB and exits at :data:`EXIT_TIME`;
* a headroom alert fires two seconds after the peak and resolves at T0 + 70;
* the second segment begins at :data:`SEGMENT2` with what a client would be listed then.
"""

from __future__ import annotations

from pathlib import Path

from memproto.frames import AlertRaised, Attached, Exited
from memproto.recording import HeadroomSnapshot, PeakStack, SegmentHeader, SegmentWriter
from memproto.records import (
    SAMPLE_COLUMNS,
    Alert,
    Contributor,
    Headroom,
    HostMemory,
    ProcessInfo,
    StackDump,
    StackFrame,
    ThreadStack,
)

MiB = 1024 * 1024
GiB = 1024 * MiB
#: 2027-01-15 08:00:00 UTC.
T0 = 1_800_000_000.0
HOST = "replay-box"
TRAINER, EXPORTER = 5001, 5002
START = {TRAINER: T0 - 100.0, EXPORTER: T0 - 50.0}
PEAK_TIME = T0 + 30
PEAK_BYTES = 900 * MiB
EXIT_TIME = T0 + 50
SEGMENT2 = T0 + 60
END = T0 + 119
TOTAL = 16 * GiB


def trainer_rss(i: int) -> int:
    """The trainer's RSS at T0 + i."""
    if i < 30:
        return (200 + 20 * i) * MiB
    return PEAK_BYTES if i == 30 else 300 * MiB


def peak_before(i: int) -> int:
    """The trainer's peak as a live memtop showed it at T0 + i."""
    return max(trainer_rss(j) for j in range(i + 1))


def info(pid: int, alive: bool, rss: int, peak: int) -> ProcessInfo:
    label = "trainer" if pid == TRAINER else "exporter"
    return ProcessInfo(pid=pid, start_time=START[pid], name="python3", cmdline=["python3", f"{label}.py"],
                       label=label, uid=1000, alive=alive, attached_at=T0 - 10,
                       exited_at=None if alive else EXIT_TIME, rss_bytes=rss, rss_peak_bytes=peak,
                       anon_bytes=rss, swap_bytes=0, rss_peak_exact=True, peak_since=START[pid])


def headroom(t: float, sum_peaks: int) -> HeadroomSnapshot:
    return HeadroomSnapshot(t, HostMemory(TOTAL, 10 * GiB, 0, 0), [
        Headroom("host", "host memory", 2 * GiB, sum_peaks, sum_peaks / (2 * GiB), TOTAL, GiB, 0, True,
                 [Contributor(TRAINER, "trainer", sum_peaks)])])


def alert(state: str, t: float) -> AlertRaised:
    return AlertRaised(Alert(7, "headroom", state, "warning", "host", 0.52, 0.5,
                             "Σ peaks 1.03 GiB would use 52% of the 2.00 GiB headroom of host memory", t, [],
                             "ratio"))


PEAK_STACK = StackDump(PEAK_TIME, "peak", PEAK_BYTES, None, [ThreadStack(1, "MainThread", True, True, [
    StackFrame("load_shard", "/srv/train/data.py", 42), StackFrame("main", "/srv/train/train.py", 7)])], 1)


def _rows(i: int) -> list[list[object]]:
    exporter_alive = T0 + i < EXIT_TIME
    return [
        [TRAINER, START[TRAINER], True, trainer_rss(i), peak_before(i), trainer_rss(i), 0, None, None, True, None],
        [EXPORTER, START[EXPORTER], exporter_alive, 150 * MiB, 150 * MiB, 150 * MiB, 0, None, None, True, None],
    ]


def write_recording(folder: Path, gap: float = 0.0) -> list[Path]:
    """The two segments in ``folder``; their paths. ``gap``: seconds the daemon was stopped
    between them (the second begins that much later)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for sequence, (first, last) in enumerate([(0, 59), (60, 119)], start=1):
        shift = gap if sequence == 2 else 0.0
        start = T0 + first + shift
        writer = SegmentWriter(SegmentHeader(1, HOST, start, 1.0, [1, 6], "memagent test", "daemon", 4242,
                                             TOTAL, sequence))
        out = bytearray(writer.header_bytes())
        # What a client is told at once: the processes, the headroom, the stacks at peak.
        trainer_peak = peak_before(first)
        writer.add(Attached(info(TRAINER, True, trainer_rss(first), trainer_peak)))
        writer.add(Attached(info(EXPORTER, T0 + first < EXIT_TIME, 150 * MiB, 150 * MiB)))
        writer.add(headroom(start, trainer_peak + 150 * MiB))
        if T0 + first > PEAK_TIME:
            writer.add(PeakStack(TRAINER, START[TRAINER], PEAK_STACK))
        for i in range(first, last + 1):
            t = T0 + i + shift
            writer.add_sample(i + 1, t, 1.0, _rows(i), SAMPLE_COLUMNS)
            if i == 30:
                writer.add(PeakStack(TRAINER, START[TRAINER], PEAK_STACK))
            elif i == 32:
                writer.add(alert("firing", t))
            elif i == 50:
                writer.add(Exited(EXPORTER, START[EXPORTER], t, 150 * MiB))
            elif i == 70:
                writer.add(alert("resolved", t))
            if i % 10 == 9:
                writer.add(headroom(t, peak_before(i) + 150 * MiB))
                out += writer.take()  # a batch about every ten seconds, as a recorder writes
        out += writer.take()
        path = folder / f"segment-{sequence:04d}.mrec"
        path.write_bytes(bytes(out))
        paths.append(path)
    return paths


def write_long(folder: Path, samples: int, processes: int, interval: float = 0.5) -> Path:
    """One segment of ``samples`` samples of ``processes`` processes whose every row changes
    at every sample (the worst case of the recorder's deltas), a batch each two samples."""
    folder.mkdir(parents=True, exist_ok=True)
    writer = SegmentWriter(SegmentHeader(1, HOST, T0, interval, [1, 6], "memagent test", "daemon", 4242, TOTAL, 1))
    out = bytearray(writer.header_bytes())
    pids = range(7000, 7000 + processes)
    for pid in pids:
        writer.add(Attached(ProcessInfo(pid=pid, start_time=T0 - pid, name="python3", cmdline=["python3", "m.py"],
                                        label=None, uid=1000, alive=True, attached_at=T0, exited_at=None,
                                        rss_bytes=MiB, rss_peak_bytes=MiB, anon_bytes=MiB, swap_bytes=0,
                                        rss_peak_exact=True, peak_since=T0)))
    for i in range(samples):
        rows = [[pid, T0 - pid, True, (100 + (i * 7 + pid) % 50) * MiB, 150 * MiB, MiB, 0, None, None, True, None]
                for pid in pids]
        writer.add_sample(i + 1, T0 + i * interval, interval, rows, SAMPLE_COLUMNS)
        if i % 2:
            out += writer.take()
    out += writer.take()
    path = folder / "segment-0001.mrec"
    path.write_bytes(bytes(out))
    return path
