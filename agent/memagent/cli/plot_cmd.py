"""``memagent plot [FILE|DIR] [--since WHEN] [--until WHEN] -o OUT.png|OUT.svg|OUT.html``:
RSS and GPU memory per process over a recording, each peak marked with its value and
time, the Σ peaks and the capacity, alerts and exits (docs/cli.md, "plot").

The format is the suffix of ``-o``. PNG and SVG need matplotlib, the optional
``memagent[plot]`` extra; HTML needs nothing. The file is written whole or not at all, and
not at all when the window holds nothing to draw (:mod:`memagent.recordings.plot_file`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from .args import Parents, Parser, UsageError, add_selection_arguments
from .exits import EXIT_USAGE, finish
from .recording_args import add_source_arguments, load_timeline
from .table import help_of

PROG = "memagent plot"
FORMATS = ("png", "svg", "html")
DEFAULT_SIZE = (1400, 800)

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


def add_parsers(sub: argparse._SubParsersAction[Parser], parents: Parents) -> None:
    p = sub.add_parser("plot", parents=parents.client, help=help_of("plot"),
                       description="RSS (and GPU memory) per process over a recording, each peak marked with its "
                                   "value and time, the sum of the peaks, the capacity, alerts and exits.",
                       epilog=EPILOG)
    add_source_arguments(p)
    p.add_argument("-o", "--output", required=True, metavar="OUT.png|OUT.svg|OUT.html",
                   help="the file to write; its suffix is the format")
    add_selection_arguments(p)
    p.add_argument("--size", type=pixels_arg, default=DEFAULT_SIZE, metavar="WxH",
                   help=f"PNG/SVG size in pixels ({DEFAULT_SIZE[0]}x{DEFAULT_SIZE[1]})")


def output_format(path: str) -> str:
    fmt = os.path.splitext(path)[1].lower().lstrip(".")
    fmt = "html" if fmt == "htm" else fmt
    if fmt not in FORMATS:
        raise UsageError(PROG, f"-o {path}: the suffix names the format: .png, .svg or .html", hint=True)
    return fmt


def make_plot(args: argparse.Namespace) -> tuple[dict[str, object], str]:
    """Write the plot ``args`` asks for; what was written (the ``--json`` object, a line)."""
    fmt = output_format(args.output)
    from ..recordings.plot_file import MissingExtra, PlotFailed, nothing_line, write_plot  # when it runs

    try:
        return write_plot(lambda: load_timeline(args, PROG, pids=args.pid, labels=args.label), args.output, fmt,
                          args.size, nothing_line(args.pid, args.label, args.since, args.until))
    except MissingExtra as exc:  # the plot extra is missing: exit 2, as a usage error
        raise PlotFailed(exc.code, str(exc), EXIT_USAGE) from None


def cmd_plot(args: argparse.Namespace) -> int:
    return finish(args.json, PROG, lambda: make_plot(args))


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"plot": cmd_plot}
