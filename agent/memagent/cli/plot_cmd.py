"""``memagent plot [FILE|DIR] [--since WHEN] [--until WHEN] -o OUT.png|OUT.svg|OUT.html``:
RSS and GPU memory per process over a recording, each peak marked with its value and
time, the Σ peaks and the capacity, alerts and exits (docs/cli.md, "plot").

The format is the suffix of ``-o``. PNG and SVG are drawn by matplotlib, the optional
``memagent[plot]`` extra, imported here only when asked for (:mod:`.plot_mpl`); HTML needs
nothing (:mod:`.plot_html`). The file is written whole or not at all (a temporary file
beside it, renamed), and not at all when the window holds nothing to draw.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from types import ModuleType

from memproto.units import format_size

from ..errors import RecordingUnavailable
from .args import Parser, UsageError, pid_arg
from .exits import EXIT_USAGE, NO_RECORDING, finish
from .recording_args import add_source_arguments, load_timeline

PROG = "memagent plot"
FORMATS = ("png", "svg", "html")
DEFAULT_SIZE = (1400, 800)
MISSING_MATPLOTLIB = ("memagent plot: PNG and SVG need matplotlib: pip install 'memagent[plot]' "
                      "(or write .html, which needs nothing)")

#: ``--json`` error codes of this command (the client's own: hyphens, docs/cli.md; and
#: report.NO_RECORDING, shared with history and report).
NO_SAMPLES = "no-samples"
MISSING_EXTRA = "missing-extra"

EPILOG = ("The format is the suffix of -o: .png and .svg need the plot extra (pip install 'memagent[plot]'); "
          ".html is one self-contained page (no network). Exit 0 written; 1 no recording, nothing in the "
          "window, or the file cannot be written; 2 a usage error or matplotlib missing.")


def pixels_arg(text: str) -> tuple[int, int]:
    """``WIDTHxHEIGHT`` in pixels, each 200 to 10000."""
    w, sep, h = text.lower().partition("x")
    try:
        size = (int(w), int(h))
    except ValueError:
        size = (0, 0)
    if not sep or not all(200 <= n <= 10000 for n in size):
        raise argparse.ArgumentTypeError(f"not a size in pixels: {text!r} (WIDTHxHEIGHT, each 200 to 10000)")
    return size


def add_parser(sub: argparse._SubParsersAction[Parser], parents: Sequence[Parser]) -> None:
    p = sub.add_parser("plot", parents=list(parents), help="draw a recording: memory per process over time",
                       description="RSS (and GPU memory) per process over a recording, each peak marked with its "
                                   "value and time, the sum of the peaks, the capacity, alerts and exits.",
                       epilog=EPILOG)
    add_source_arguments(p)
    p.add_argument("-o", "--output", required=True, metavar="OUT.png|OUT.svg|OUT.html",
                   help="the file to write; its suffix is the format")
    p.add_argument("--pid", type=pid_arg, action="append", default=[], metavar="PID",
                   help="only this process (repeatable)")
    p.add_argument("--label", action="append", default=[], metavar="LABEL",
                   help="only the processes with this label (repeatable)")
    p.add_argument("--size", type=pixels_arg, default=DEFAULT_SIZE, metavar="WxH",
                   help=f"PNG/SVG size in pixels ({DEFAULT_SIZE[0]}x{DEFAULT_SIZE[1]})")


def output_format(path: str) -> str:
    fmt = os.path.splitext(path)[1].lower().lstrip(".")
    fmt = "html" if fmt == "htm" else fmt
    if fmt not in FORMATS:
        raise UsageError(PROG, f"-o {path}: the suffix names the format: .png, .svg or .html", hint=True)
    return fmt


def _matplotlib_renderer() -> ModuleType:
    from ..recordings.plot_file import PlotFailed

    try:
        from ..recordings import plot_mpl
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] == "matplotlib":
            raise PlotFailed(MISSING_EXTRA, MISSING_MATPLOTLIB.removeprefix(f"{PROG}: "), EXIT_USAGE) from None
        raise PlotFailed(MISSING_EXTRA, f"matplotlib cannot be imported ({exc}): pip install 'memagent[plot]' "
                         "(or write .html, which needs nothing)", EXIT_USAGE) from None
    return plot_mpl


def _nothing(args: argparse.Namespace) -> str:
    who = [f"PID {p}" for p in args.pid] + [f"label {label!r}" for label in args.label]
    window = "".join(f" {flag} {getattr(args, flag.strip('-'))}" for flag in ("--since", "--until")
                     if getattr(args, flag.strip("-")) is not None)
    what = f"no samples of {' or '.join(who)}" if who else "no samples"
    return f"{what} in the recording{' window' + window if window else ''}; nothing written"


def make_plot(args: argparse.Namespace) -> tuple[dict[str, object], str]:
    """Write the plot ``args`` asks for; what was written (the ``--json`` object, a line)."""
    from ..recordings.plot_data import (  # the reader: imported when the command runs, not when the parser is built
        plot_data,
        title,
    )
    from ..recordings.plot_file import PlotFailed, check_plot_path, write_whole
    from ..recordings.timeline import iso

    fmt = output_format(args.output)
    check_plot_path(args.output)
    render: Callable[..., bytes] | None = None
    if fmt in ("png", "svg"):
        render = _matplotlib_renderer().render
    try:
        timeline = load_timeline(args, PROG, pids=args.pid, labels=args.label)
    except RecordingUnavailable as exc:
        raise PlotFailed(NO_RECORDING, str(exc)) from None
    data = plot_data(timeline)
    if data is None or not data.processes:
        raise PlotFailed(NO_SAMPLES, _nothing(args))
    if render is not None:
        content = render(data, fmt, args.size)
    else:
        from ..recordings.plot_html import render as render_html

        content = render_html(data, title(data))
    write_whole(args.output, content)
    path = os.path.abspath(args.output)
    done: dict[str, object] = {"file": path, "format": fmt, "processes": len(data.processes),
                               "samples": data.samples, "first": iso(data.first), "last": iso(data.last),
                               "bytes": len(content)}
    n = len(data.processes)
    line = (f"{path}: {fmt}, {n} process{'es' if n != 1 else ''}, {data.samples} samples from {iso(data.first)} "
            f"to {iso(data.last)} ({format_size(len(content), long=True)})")
    return done, line


def cmd_plot(args: argparse.Namespace) -> int:
    return finish(args.json, PROG, lambda: make_plot(args))


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"plot": cmd_plot}
