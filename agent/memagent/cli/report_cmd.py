"""``memagent report [FILE|DIR] [--since WHEN] [--until WHEN] [--pid PID…] [--label L…] [--top N] [--json]``:
what a recording says, for people or scripts (docs/cli.md, "report"): the processes that
peaked highest, when, and the Python stack at the peak where one was recorded; the highest
sum of the peaks and when, against the capacity; the alerts; the OOM kills.

An empty window is an answer, not an error (exit 0, "nothing recorded"); a ``--pid`` or
``--label`` that matches nothing in it is one (exit 1).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from memproto.text import printable

from ..prose import frame_text, human_bytes
from .args import Parser, pid_arg
from .exits import EXIT_FAILED, EXIT_OK, error_json, print_json
from .recording_args import add_source_arguments, load_timeline, window

PROG = "memagent report"
DEFAULT_TOP = 10
#: Frames of the stack at the peak shown in text (JSON has them all).
STACK_FRAMES = 5

EPILOG = ("Exit 0: the report, even of an empty window (it says so); 1 no recording, or no samples of the --pid "
          "or --label asked for; 2 a usage error. Times in --json are Unix seconds.")


def top_arg(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 100_000:
        raise argparse.ArgumentTypeError(f"not a count from 1 to 100000: {text!r}")
    return n


def add_parser(sub: argparse._SubParsersAction[Parser], parents: list[Parser]) -> None:
    p = sub.add_parser("report", parents=parents, help="the peaks, Σ peaks, alerts and OOM kills of a recording",
                       description="From a recording: the processes that peaked highest, when, and the stack at "
                                   "the peak; the highest sum of the peaks; alerts; OOM kills.", epilog=EPILOG)
    add_source_arguments(p)
    p.add_argument("--pid", type=pid_arg, action="append", default=[], metavar="PID",
                   help="only this process (repeatable)")
    p.add_argument("--label", action="append", default=[], metavar="LABEL",
                   help="only the processes with this label (repeatable)")
    p.add_argument("--top", type=top_arg, default=DEFAULT_TOP, metavar="N",
                   help=f"how many processes, highest peak first ({DEFAULT_TOP})")


# --------------------------------------------------------------------------- the report as text


def _clock(t: float | None) -> str:
    return "n/a" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "es" if what.endswith("s") else "s")


def text_lines(r: dict[str, Any]) -> list[str]:
    where = ", ".join(printable(p) for p in r["source"])
    if r["first_time"] is None:
        return [f"recording {where}: nothing recorded in this window"]
    lines = [f"recording {where}: host {printable(r['host'])}, {_count(r['segments'], 'segment')}"]
    lines[0] += (f", {_clock(r['first_time'])} to {_clock(r['last_time'])} "
                 f"({_duration(r['last_time'] - r['first_time'])}, {r['samples']} samples)")
    shown = len(r["processes"])
    lines.append(f"top {shown} of {_count(r['processes_total'], 'process')} by peak"
                 + (" (<=: reached before the window began, when exactly is not recorded):"
                    if any(p["peak_before_window"] for p in r["processes"]) else ":"))
    gpu = any(p["vram_peak_bytes"] is not None for p in r["processes"])
    lines.append(f"  {'PID':>7}  {'NAME':<24} {'PEAK':>10}  {'  WHEN':<21}" + (f" {'VRAM PEAK':>10}" if gpu else "")
                 + "  EXITED")
    for p in r["processes"]:
        name = printable(p["label"] or p["name"] or "")[:24]
        peak = human_bytes(p["peak_bytes"]) + ("" if p["peak_exact"] else "~")
        vram = f" {human_bytes(p['vram_peak_bytes']):>10}" if gpu else ""
        exited = _clock(p["exited_at"]) if p["exited_at"] is not None else "-"
        when = ("<=" if p["peak_before_window"] else "  ") + _clock(p["peak_time"])
        lines.append(f"  {p['pid']:>7}  {name:<24} {peak:>10}  {when:<21}{vram}  {exited}")
        stack = p["stack"]
        if stack is not None and stack["frames"]:
            thread = printable(stack["thread_name"] or str(stack["thread_id"]))
            lines.append(f"           stack at the peak ({_clock(stack['time'])}, thread {thread}, innermost first):")
            lines.extend(f"             {frame_text(f['name'], f['filename'], f['line'])}"
                         for f in stack["frames"][:STACK_FRAMES])
    s = r["sum_peaks"]
    if s is not None:
        cap = (f" of {human_bytes(s['capacity_bytes'])} capacity ({s['ratio']:.0%})"
               if s["capacity_bytes"] and s["ratio"] is not None else "")
        lines.append(f"highest Σ peaks: {human_bytes(s['bytes'])} at {_clock(s['time'])}{cap}")
    lines.append(f"alerts: {len(r['alerts']) or 'none'}")
    for a in r["alerts"]:
        ended = f" -> {a['state']} {_clock(a['last_time'])}" if a["last_time"] != a["time"] else ""
        lines.append(f"  {_clock(a['time'])}  {a['severity']:<8} {printable(a['kind'])} "
                     f"[{printable(a['resource'])}] {printable(a['state']) if not ended else 'firing'}{ended}: "
                     f"{printable(a['message'])}")
    lines.append(f"OOM kills: {len(r['oom_kills']) or 'none'}")
    for o in r["oom_kills"]:
        lines.append(f"  {_clock(o['time'])}  pid {o['pid']}: {printable(o['message'])}")
    if r["damage"]:
        lines.append(f"damaged parts skipped: {len(r['damage'])} (listed on stderr)")
    return lines


def cmd_report(args: argparse.Namespace) -> int:
    from ..recordings.analysis import (
        report_json,  # the reader: imported when the command runs, not when the parser is built
    )
    from ..recordings.source import source_paths

    window(args, PROG)  # a bad --since is a usage error before anything is read
    # RecordingUnavailable: one line (main), before the window is read
    paths = source_paths(getattr(args, "source", None), getattr(args, "socket", None))
    args.source = paths[0]
    tl = load_timeline(args, PROG, pids=args.pid, labels=args.label)
    r = report_json(tl, paths, args.top)
    missing = [f"no samples of PID {pid}" for pid in args.pid if not any(t.pid == pid for t in tl.tracks.values())]
    missing += [f"no samples of a process labelled {label!r}" for label in args.label
                if not any(t.label == label for t in tl.tracks.values())]
    if missing and not tl.tracks:
        problem = f"{'; '.join(missing)} in the recording" + (" window" if args.since or args.until else "")
        print(f"{PROG}: {printable(problem)}", file=sys.stderr)
        if args.json:
            print_json({"error": error_json("no-samples", problem)})
        return EXIT_FAILED
    if args.json:
        print_json(r)
    else:
        print("\n".join(text_lines(r)))
    for m in missing:
        print(f"{PROG}: {printable(m)}", file=sys.stderr)
    return EXIT_FAILED if missing else EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"report": cmd_report}
