"""Processes' memory over time, as ``memagent history`` shows it, from either source: the
daemon's RAM (its ``history`` request: slots of the highest RSS, protocol.md §11.6) or a
recording (its timeline's samples). Here the points, which source answers (:func:`gather`),
what was not found, and the text and CSV rows; the flags are the command's
(:mod:`memagent.cli.history_cmd`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from memproto.client_side import CannotConnect, DaemonNotRunning
from memproto.records import Failure, ProcessInfo, Series
from memproto.text import printable
from memproto.vocabulary import ErrorCode

from ..client import Client, connect
from ..errors import RecordingUnavailable
from ..prose import human_bytes
from . import RAM as RAM
from . import RECORDING as RECORDING
from .timeline import Timeline, Track, iso

#: (time, RSS, VRAM or None) of one point.
Point = tuple[float, int, int | None]


@dataclass
class ProcessHistory:
    """One process's points in the window, from one source."""

    pid: int
    start_time: float
    name: str
    label: str | None
    source: str
    #: Seconds between points: the RAM's slot, or the recording's sample interval.
    step: float
    points: list[Point] = field(default_factory=list)
    #: The daemon's peak of the process (kernel's mark included), as ``ls`` shows it.
    rss_peak_bytes: int = 0
    rss_peak_exact: bool = True
    exited_at: float | None = None

    def peak(self) -> tuple[int, float | None]:
        """The highest RSS point in the window and the first time at it."""
        best: tuple[int, float | None] = (0, None)
        for t, rss, _ in self.points:
            if best[1] is None or rss > best[0]:
                best = (rss, t)
        return best

    def json(self) -> dict[str, Any]:
        peak, when = self.peak()
        return {"pid": self.pid, "start_time": self.start_time, "name": self.name, "label": self.label,
                "source": self.source, "step": self.step, "points": [list(p) for p in self.points],
                "peak_bytes": peak, "peak_time": when, "rss_peak_bytes": self.rss_peak_bytes,
                "rss_peak_exact": self.rss_peak_exact, "exited_at": self.exited_at}


@dataclass
class Result:
    """What the command found: the processes, whence (for the header), and what it did not find."""

    processes: list[ProcessHistory]
    source: str
    where: str
    failures: list[Failure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- the daemon's RAM


def _slots(series: Series, step: float) -> list[tuple[float, int]]:
    """(slot start, highest RSS in it) of a series, oldest first (protocol.md §11.6)."""
    n = len(series.rss_bytes)
    return [(series.end_time - (n - i) * step, v) for i, v in enumerate(series.rss_bytes)]


def _ram_covers(series: Series | None, info: ProcessInfo, since: float | None, step: float) -> bool:
    """Whether the RAM holds the process back to the window's start (or its attach, if later)."""
    if since is None:
        return True
    if series is None or not series.rss_bytes:
        return False
    first = series.end_time - len(series.rss_bytes) * step
    return first <= max(since, info.attached_at) + step


def _wanted(pids: Sequence[int], labels: Sequence[str]) -> Callable[[int, str | None], bool]:
    every = not pids and not labels
    return lambda pid, label: every or pid in pids or (label is not None and label in labels)


def from_ram(client: Client, pids: Sequence[int], labels: Sequence[str], since: float | None,
             until: float | None) -> tuple[list[ProcessHistory], bool]:
    """The processes asked for (none: every one), from the daemon's RAM; and whether it
    reaches back to ``since``."""
    wanted = _wanted(pids, labels)
    infos = {(p.pid, p.start_time): p for p in client.list() if wanted(p.pid, p.label)}
    if not infos:
        return [], True
    step = max(1.0, client.server_hello.interval or 1.0)
    seconds = None if since is None else max(step, time.time() - since + step)
    explicit = sorted({pid for pid, _ in infos}) if pids or labels else []
    reply = client.history(explicit, seconds)
    step = reply.step or step
    by_key = {(s.pid, s.start_time): s for s in reply.series}
    out, covered = [], True
    for key, info in infos.items():
        series = by_key.get(key)
        covered = covered and _ram_covers(series, info, since, step)
        slots = _slots(series, step) if series is not None else []
        points: list[Point] = [(t, v, None) for t, v in slots
                               if (since is None or t + step > since) and (until is None or t <= until)]
        out.append(ProcessHistory(info.pid, info.start_time, info.name, info.label, RAM, step, points,
                                  info.rss_peak_bytes, info.rss_peak_exact, info.exited_at))
    return out, covered


# --------------------------------------------------------------------------- a recording, and what is shown


def of_track(track: Track, tl: Timeline) -> ProcessHistory:
    """A recording's process as a history (its samples' points)."""
    points: list[Point] = list(zip(track.times, track.rss, track.vram, strict=True))
    return ProcessHistory(track.pid, track.start_time, track.name, track.label, RECORDING, tl.interval, points,
                          track.peak_bytes, track.peak_exact, track.exited_at)


def keep_shown(found: list[ProcessHistory], source: str, where: str, pids: Sequence[int], labels: Sequence[str],
               windowed: bool) -> Result:
    """Keep the processes with points in the window; a failure per PID or label asked for
    that has none (``windowed``: the window was given, the message says so)."""
    shown = sorted((p for p in found if p.points), key=lambda p: (p.points[0][0], p.pid))
    failures: list[Failure] = []
    in_window = " in the window" if windowed else ""
    for pid in dict.fromkeys(pids):
        if not any(p.pid == pid for p in shown):
            known = any(p.pid == pid for p in found)
            why = f"no points{in_window}" if known else ("not watched" if source == RAM else "not in the recording")
            failures.append(Failure(pid, ErrorCode.NO_SUCH_PROCESS, f"{why}: {pid}"))
    for label in dict.fromkeys(labels):
        if not any(p.label == label for p in shown):
            failures.append(Failure(0, ErrorCode.NO_SUCH_PROCESS, f"no process labelled {label!r} with points"
                                    f"{in_window}"))
    return Result(shown, source, where, failures)


def of_timeline(tl: Timeline, file: str | None) -> tuple[list[ProcessHistory], str]:
    """A recording's processes, and whence for the header (``file``: the FILE|DIR given,
    else the daemon's flight recorder)."""
    where = f"the recording at {file}" if file else "the daemon's flight recorder"
    segments = f"{tl.segments} segment{'' if tl.segments == 1 else 's'}"
    return [of_track(t, tl) for t in tl.tracks.values()], f"{where} ({segments}, host {tl.host})"


# --------------------------------------------------------------------------- choosing the source


@dataclass(frozen=True)
class Query:
    """What ``memagent history`` asks for: the processes (none: every one), the window
    (``windowed``: a window was given), where from (``origin``: auto, RAM or RECORDING;
    ``file``: the recording given), the daemon's socket."""

    pids: Sequence[int]
    labels: Sequence[str]
    since: float | None
    until: float | None
    windowed: bool
    origin: str
    file: str | None
    socket: str | None


def gather(q: Query, read: Callable[[], tuple[list[ProcessHistory], str]]) -> Result:
    """The processes ``q`` asks for, from the source that answers (the module's and
    docs/cli.md's rule); ``read`` reads the recording (:func:`of_timeline`), only if needed.
    No daemon and no recording to read: the daemon's error."""

    def shown(found: list[ProcessHistory], source: str, where: str) -> Result:
        return keep_shown(found, source, where, q.pids, q.labels, q.windowed)

    if q.file or q.origin == RECORDING:
        found, rec_where = read()
        return shown(found, RECORDING, rec_where)
    try:
        client = connect(q.socket)
    except (DaemonNotRunning, CannotConnect) as no_daemon:
        if q.origin == RAM:
            raise
        try:  # no daemon: its flight recorder may still be there (the default place)
            found, rec_where = read()
        except RecordingUnavailable:
            raise no_daemon from None  # neither: "no daemon" says what to do
        return shown(found, RECORDING, rec_where)
    with client:
        ram, covered = from_ram(client, q.pids, q.labels, q.since, q.until)
        path = client.path
    where = f"the daemon's RAM ({path})"
    if q.origin == RAM or covered:
        return shown(ram, RAM, where)
    try:
        found, rec_where = read()
    except RecordingUnavailable as exc:
        result = shown(ram, RAM, where)
        result.notes.append(f"the daemon's RAM does not reach back to --since and there is no recording to read "
                            f"({exc}): showing what the RAM holds")
        return result
    if not any(p.points for p in found):
        result = shown(ram, RAM, where)
        result.notes.append("the recording holds nothing of these processes in the window: showing what the "
                            "daemon's RAM holds")
        return result
    return shown(found, RECORDING, rec_where)


# --------------------------------------------------------------------------- the result as text and CSV


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 10)}"


def text_lines(result: Result) -> list[str]:
    """``memagent history`` without ``--csv`` or ``--json``."""
    what = ("slots of {step:g} s, each the highest RSS sampled in it" if result.source == RAM
            else "one point per sample, every {step:g} s")
    lines = [f"source: {printable(result.where)}"]
    if not result.processes:
        lines.append("no process has points in this window")
    for p in result.processes:
        peak, when = p.peak()
        gpu = any(v is not None for _, _, v in p.points)
        name = printable(p.label or p.name or str(p.pid))
        exited = f", exited {iso(p.exited_at)}" if p.exited_at is not None else ""
        lines.append(f"{p.pid} ({name}): peak {human_bytes(peak)} at {iso(when) if when else 'n/a'} in the window; "
                     f"process peak {human_bytes(p.rss_peak_bytes)}{'' if p.rss_peak_exact else '~'}{exited}; "
                     + what.format(step=p.step))
        lines.append(f"  {'TIME':<23} {'RSS':>10}" + (f" {'VRAM':>10}" if gpu else ""))
        for t, rss, vram in p.points:
            lines.append(f"  {_clock(t):<23} {human_bytes(rss):>10}" + (f" {human_bytes(vram):>10}" if gpu else ""))
    return lines


def csv_rows(result: Result) -> Iterator[tuple[object, ...]]:
    """The ``--csv`` rows under its header: time, pid, start_time, label, rss_bytes, vram_bytes."""
    for p in result.processes:
        for t, rss, vram in p.points:
            yield f"{t:.3f}", p.pid, f"{p.start_time:.2f}", p.label or "", rss, "" if vram is None else vram
