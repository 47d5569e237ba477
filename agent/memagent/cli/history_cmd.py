"""``memagent history PID…|--label L… [--since WHEN] [--until WHEN] [--file FILE|DIR] [--csv|--json]``:
the memory of processes over time, from the daemon's RAM or from a recording (docs/cli.md,
"history").

Where the points come from (``--from auto``, the default): the daemon's RAM (its
peak-preserving ``history``, docs/sampling.md#history: slots of max(1 s, interval), the last 600 s
by default) when no ``--file`` is given and the RAM reaches back to the window's start for
every process asked for (its first slot is not later than ``--since`` or the process's
attach); else the recording (``--file``, or the daemon's flight recorder). RAM that does
not reach back and no recording to read: RAM's points, and one line on stderr saying so.
The output names the source: a header line, or ``"source"`` in each JSON object.

No PID and no ``--label``: every process the caller may see that has points in the window.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memproto.client_side import CannotConnect, DaemonNotRunning
from memproto.records import Failure, ProcessInfo, Series
from memproto.text import printable
from memproto.vocabulary import ErrorCode

from .args import Parser, UsageError, pid_arg
from .client import Client, connect
from .recorded import RecordingUnavailable, add_source_arguments, load_timeline, window
from .render import human_bytes
from .report import EXIT_FAILED, EXIT_OK, error_json, print_json
from .timeline import Timeline, Track, iso

PROG = "memagent history"
RAM, RECORDING = "ram", "recording"
CSV_HEADER = ("time", "pid", "start_time", "label", "rss_bytes", "vram_bytes")

EPILOG = ("Source: the daemon's RAM when it reaches back to --since (and no --file), else the recording "
          "(--file, or the daemon's flight recorder); --from forces one. Exit 0 done; 1 a PID or label with "
          "no points in the window (one line each), no recording, or the daemon failed; 2 no daemon (RAM) "
          "or a usage error.")

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


def add_parser(sub: argparse._SubParsersAction[Parser], parents: list[Parser]) -> None:
    p = sub.add_parser("history", parents=parents, help="memory of processes over time (RAM or recording)",
                       description="RSS (and GPU memory, from a recording) of processes over time: from the "
                                   "daemon's RAM (the last 10 minutes by default) or from a recording.",
                       epilog=EPILOG)
    p.add_argument("pids", nargs="*", type=pid_arg, metavar="PID",
                   help="these processes (none and no --label: every process with points in the window)")
    p.add_argument("--label", action="append", default=[], metavar="LABEL",
                   help="the processes with this label (repeatable)")
    p.add_argument("--file", dest="source", metavar="FILE|DIR",
                   help="read this recording (memagent record -o) or recorder directory")
    p.add_argument("--from", dest="origin", choices=("auto", RAM, RECORDING), default="auto",
                   help="where from: the daemon's RAM, a recording, or auto (default: RAM when it reaches "
                        "back to --since)")
    add_source_arguments(p, positional=False)
    p.add_argument("--csv", action="store_true", help=f"CSV on stdout: {','.join(CSV_HEADER)}")


# --------------------------------------------------------------------------- RAM


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


def from_ram(client: Client, args: argparse.Namespace, since: float | None,
             until: float | None) -> tuple[list[ProcessHistory], bool]:
    """The processes asked for, from the daemon's RAM; and whether it reaches back to ``since``."""
    wanted = _wanted(args.pids, args.label)
    infos = {(p.pid, p.start_time): p for p in client.list() if wanted(p.pid, p.label)}
    if not infos:
        return [], True
    step = max(1.0, client.server_hello.interval or 1.0)
    seconds = None if since is None else max(step, time.time() - since + step)
    explicit = sorted({pid for pid, _ in infos}) if args.pids or args.label else []
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


# --------------------------------------------------------------------------- recording


def _of_track(track: Track, tl: Timeline) -> ProcessHistory:
    points: list[Point] = list(zip(track.times, track.rss, track.vram, strict=True))
    return ProcessHistory(track.pid, track.start_time, track.name, track.label, RECORDING, tl.interval, points,
                          track.peak_bytes, track.peak_exact, track.exited_at)


def from_recording(args: argparse.Namespace) -> tuple[list[ProcessHistory], str]:
    """The processes asked for, from the recording ``args`` names (or the flight recorder)."""
    tl = load_timeline(args, PROG, pids=args.pids, labels=args.label)
    where = f"the recording at {args.source}" if args.source else "the daemon's flight recorder"
    segments = f"{tl.segments} segment{'' if tl.segments == 1 else 's'}"
    return [_of_track(t, tl) for t in tl.tracks.values()], f"{where} ({segments}, host {tl.host})"


# --------------------------------------------------------------------------- choosing, then presenting


def gather(args: argparse.Namespace) -> Result:
    since, until = window(args, PROG)
    origin = args.origin
    if args.source and origin == RAM:
        raise UsageError(PROG, "--file reads a recording: it goes with --from recording or auto", hint=True)
    if args.source or origin == RECORDING:
        found, where = from_recording(args)
        return _finish(found, RECORDING, where, args)
    try:
        client = connect(args.socket)
    except (DaemonNotRunning, CannotConnect) as no_daemon:
        if origin == RAM:
            raise
        try:  # no daemon: its flight recorder may still be there (the default place)
            found, rec_where = from_recording(args)
        except RecordingUnavailable:
            raise no_daemon from None  # neither: "no daemon" says what to do
        return _finish(found, RECORDING, rec_where, args)
    with client:
        ram, covered = from_ram(client, args, since, until)
        path = client.path
    where = f"the daemon's RAM ({path})"
    if origin == RAM or covered:
        return _finish(ram, RAM, where, args)
    try:
        found, rec_where = from_recording(args)
    except RecordingUnavailable as exc:
        result = _finish(ram, RAM, where, args)
        result.notes.append(f"the daemon's RAM does not reach back to --since and there is no recording to read "
                            f"({exc}): showing what the RAM holds")
        return result
    if not any(p.points for p in found):
        result = _finish(ram, RAM, where, args)
        result.notes.append("the recording holds nothing of these processes in the window: showing what the "
                            "daemon's RAM holds")
        return result
    return _finish(found, RECORDING, rec_where, args)


def _finish(found: list[ProcessHistory], source: str, where: str, args: argparse.Namespace) -> Result:
    """Keep the processes with points in the window; a failure per PID or label that has none."""
    shown = sorted((p for p in found if p.points), key=lambda p: (p.points[0][0], p.pid))
    failures: list[Failure] = []
    in_window = " in the window" if args.since or args.until else ""
    for pid in dict.fromkeys(args.pids):
        if not any(p.pid == pid for p in shown):
            known = any(p.pid == pid for p in found)
            why = f"no points{in_window}" if known else ("not watched" if source == RAM else "not in the recording")
            failures.append(Failure(pid, ErrorCode.NO_SUCH_PROCESS, f"{why}: {pid}"))
    for label in dict.fromkeys(args.label):
        if not any(p.label == label for p in shown):
            failures.append(Failure(0, ErrorCode.NO_SUCH_PROCESS, f"no process labelled {label!r} with points"
                                    f"{in_window}"))
    return Result(shown, source, where, failures)


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 10)}"


def text_lines(result: Result) -> list[str]:
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


def write_csv(result: Result) -> None:
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(CSV_HEADER)
    for p in result.processes:
        for t, rss, vram in p.points:
            out.writerow((f"{t:.3f}", p.pid, f"{p.start_time:.2f}", p.label or "", rss, "" if vram is None else vram))


def cmd_history(args: argparse.Namespace) -> int:
    if args.csv and args.json:
        raise UsageError(PROG, "--csv and --json: choose one", hint=True)
    result = gather(args)
    failures = [error_json(f.code, f.message, f.pid or None) for f in result.failures]
    if args.json:
        done = [p.json() for p in result.processes]
        if not failures:
            print_json(done)
        elif done:
            print_json({"history": done, "failures": failures})
        else:
            print_json({"error": failures[0], "failures": failures})
    elif args.csv:
        write_csv(result)
    else:
        print("\n".join(text_lines(result)))
    for note in result.notes:
        print(f"{PROG}: {printable(note)}", file=sys.stderr)
    for f in result.failures:
        print(f"{PROG}: {printable(f.message)}", file=sys.stderr)
    return EXIT_FAILED if result.failures else EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"history": cmd_history}
