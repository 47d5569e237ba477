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
from collections.abc import Callable

from memproto.client_side import CannotConnect, DaemonNotRunning
from memproto.text import printable

from ..client import connect
from ..errors import RecordingUnavailable
from ..prose import human_bytes
from ..recordings.history import RAM, RECORDING, ProcessHistory, Result, from_ram, keep_shown, of_track
from ..recordings.timeline import iso
from .args import Parser, UsageError, pid_arg
from .exits import EXIT_FAILED, EXIT_OK, error_json, print_json
from .recording_args import add_source_arguments, load_timeline, window

PROG = "memagent history"
CSV_HEADER = ("time", "pid", "start_time", "label", "rss_bytes", "vram_bytes")

EPILOG = ("Source: the daemon's RAM when it reaches back to --since (and no --file), else the recording "
          "(--file, or the daemon's flight recorder); --from forces one. Exit 0 done; 1 a PID or label with "
          "no points in the window (one line each), no recording, or the daemon failed; 2 no daemon (RAM) "
          "or a usage error.")

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


# --------------------------------------------------------------------------- recording


def from_recording(args: argparse.Namespace) -> tuple[list[ProcessHistory], str]:
    """The processes asked for, from the recording ``args`` names (or the flight recorder)."""
    tl = load_timeline(args, PROG, pids=args.pids, labels=args.label)
    where = f"the recording at {args.source}" if args.source else "the daemon's flight recorder"
    segments = f"{tl.segments} segment{'' if tl.segments == 1 else 's'}"
    return [of_track(t, tl) for t in tl.tracks.values()], f"{where} ({segments}, host {tl.host})"


# --------------------------------------------------------------------------- choosing, then presenting


def gather(args: argparse.Namespace) -> Result:
    since, until = window(args, PROG)
    origin = args.origin

    def shown(found: list[ProcessHistory], source: str, where: str) -> Result:
        return keep_shown(found, source, where, args.pids, args.label, bool(args.since or args.until))

    if args.source and origin == RAM:
        raise UsageError(PROG, "--file reads a recording: it goes with --from recording or auto", hint=True)
    if args.source or origin == RECORDING:
        found, where = from_recording(args)
        return shown(found, RECORDING, where)
    try:
        client = connect(args.socket)
    except (DaemonNotRunning, CannotConnect) as no_daemon:
        if origin == RAM:
            raise
        try:  # no daemon: its flight recorder may still be there (the default place)
            found, rec_where = from_recording(args)
        except RecordingUnavailable:
            raise no_daemon from None  # neither: "no daemon" says what to do
        return shown(found, RECORDING, rec_where)
    with client:
        ram, covered = from_ram(client, args.pids, args.label, since, until)
        path = client.path
    where = f"the daemon's RAM ({path})"
    if origin == RAM or covered:
        return shown(ram, RAM, where)
    try:
        found, rec_where = from_recording(args)
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
