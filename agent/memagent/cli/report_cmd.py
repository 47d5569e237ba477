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

from memproto.records import Alert, StackDump, ThreadStack
from memproto.text import printable
from memproto.vocabulary import AlertKind

from ..recordings.source import add_source_arguments, load_timeline, source_paths, window
from ..recordings.timeline import Timeline, Track
from .args import Parser, pid_arg
from .exits import EXIT_FAILED, EXIT_OK, error_json, print_json
from .render import frame_text, human_bytes

PROG = "memagent report"
DEFAULT_TOP = 10
#: Frames of the stack at the peak shown in text (JSON has them all).
STACK_FRAMES = 5
SEVERITY_RANK = {"warning": 1, "critical": 2}

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


# --------------------------------------------------------------------------- the report as data


def stack_thread(dump: StackDump) -> ThreadStack | None:
    """The thread the peak is blamed on: the attributed one, else the first active, else the first."""
    return dump.attributed() or next((t for t in dump.threads if t.active), None) or next(iter(dump.threads), None)


def stack_json(dump: StackDump | None) -> dict[str, Any] | None:
    if dump is None:
        return None
    thread = stack_thread(dump)
    return {"time": dump.time, "trigger": dump.trigger, "rss_bytes": dump.rss_bytes,
            "thread_id": thread.thread_id if thread else None, "thread_name": thread.name if thread else None,
            "frames": [{"name": f.name, "filename": f.filename, "line": f.line} for f in thread.frames]
            if thread else []}


def peak_before_window(t: Track, interval: float) -> bool:
    """Whether the peak was already reached when the window first saw the process (it
    started, or was attached, before): then ``peak_time`` is that first sample's, and the
    moment of the peak itself is not in the window."""
    first = t.times[0] if t.times else t.peak_time
    return first is not None and t.peak_time is not None and t.peak_time <= first \
        and t.start_time < first - max(interval, 1.0)


def process_json(t: Track, interval: float) -> dict[str, Any]:
    return {"pid": t.pid, "start_time": t.start_time, "name": t.name, "label": t.label, "cmdline": t.cmdline,
            "peak_bytes": t.peak_bytes, "peak_time": t.peak_time, "peak_exact": t.peak_exact,
            "peak_before_window": peak_before_window(t, interval),
            "vram_peak_bytes": t.vram_peak_bytes, "vram_peak_time": t.vram_peak_time, "exited_at": t.exited_at,
            "stack": stack_json(t.peak_stack)}


def alerts_json(alerts: list[Alert]) -> list[dict[str, Any]]:
    """One entry per alert (its id): when it first fired in the window, its most severe
    level, its last state, message and time."""
    out: dict[int, dict[str, Any]] = {}
    for a in sorted(alerts, key=lambda a: a.time):
        entry = out.get(a.id)
        if entry is None:
            entry = out[a.id] = {"id": a.id, "kind": a.kind, "resource": a.resource, "pid": a.pid,
                                 "severity": a.severity, "time": a.time}
        elif SEVERITY_RANK.get(a.severity, 0) > SEVERITY_RANK.get(entry["severity"], 0):
            entry["severity"] = a.severity
        entry.update(state=a.state, last_time=a.time, message=a.message, value=a.value, threshold=a.threshold,
                     unit=a.unit)
    return list(out.values())


def oom_json(a: Alert) -> dict[str, Any]:
    return {"time": a.time, "pid": a.pid, "resource": a.resource, "severity": a.severity, "message": a.message,
            "source": a.source, "details": a.details}


def report_json(tl: Timeline, paths: list[str], top: int) -> dict[str, Any]:
    highest = tl.highest_sum()
    sums: dict[str, Any] | None = None
    if highest is not None:
        when, total = highest
        cap = tl.capacity_bytes
        sums = {"bytes": total, "time": when, "capacity_bytes": cap,
                "ratio": round(total / cap, 4) if cap else None}
    tracks = tl.by_peak()
    return {"source": paths, "host": tl.host, "interval": tl.interval, "segments": tl.segments,
            "first_time": tl.first, "last_time": tl.last, "samples": len(tl.sum_peaks),
            "processes_total": len(tracks), "processes": [process_json(t, tl.interval) for t in tracks[:top]],
            "sum_peaks": sums, "alerts": alerts_json([a for a in tl.alerts if a.kind != AlertKind.OOM_KILL]),
            "oom_kills": [oom_json(a) for a in tl.oom_kills], "damage": tl.damage}


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
    window(args, PROG)  # a bad --since is a usage error before anything is read
    paths = source_paths(args)  # RecordingUnavailable: one line (main), before the window is read
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
