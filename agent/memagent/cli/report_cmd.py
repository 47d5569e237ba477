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
from collections.abc import Callable

from memproto.text import printable

from .args import Parents, Parser, add_selection_arguments, int_range_arg
from .exits import EXIT_FAILED, EXIT_OK, error_json, print_json
from .recording_args import add_source_arguments, load_timeline, window
from .table import help_of

PROG = "memagent report"
DEFAULT_TOP = 10

EPILOG = ("Exit 0: the report, even of an empty window (it says so); 1 no recording, or no samples of the --pid "
          "or --label asked for; 2 a usage error. Times in --json are Unix seconds.")

top_arg = int_range_arg(1, 100_000, "a count from 1 to 100000")


def add_parsers(sub: argparse._SubParsersAction[Parser], parents: Parents) -> None:
    p = sub.add_parser("report", parents=parents.client, help=help_of("report"),
                       description="From a recording: the processes that peaked highest, when, and the stack at "
                                   "the peak; the highest sum of the peaks; alerts; OOM kills.", epilog=EPILOG)
    add_source_arguments(p)
    add_selection_arguments(p)
    p.add_argument("--top", type=top_arg, default=DEFAULT_TOP, metavar="N",
                   help=f"how many processes, highest peak first ({DEFAULT_TOP})")


def cmd_report(args: argparse.Namespace) -> int:
    # the reader: imported when the command runs, not when the parser is built
    from ..recordings.analysis import missing_asked, report_json
    from ..recordings.report_text import text_lines
    from ..recordings.source import source_paths

    window(args, PROG)  # a bad --since is a usage error before anything is read
    # RecordingUnavailable: one line (main), before the window is read
    paths = source_paths(getattr(args, "source", None), getattr(args, "socket", None))
    args.source = paths[0]
    tl = load_timeline(args, PROG, pids=args.pid, labels=args.label)
    r = report_json(tl, paths, args.top)
    missing = missing_asked(tl, args.pid, args.label)
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
