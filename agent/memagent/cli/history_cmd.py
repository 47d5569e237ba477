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
from collections.abc import Callable

from memproto.text import printable

from ..recordings import RAM, RECORDING
from .args import Parents, Parser, UsageError, pid_arg
from .exits import EXIT_FAILED, EXIT_OK, error_json, print_json
from .recording_args import add_source_arguments, load_timeline, window
from .table import help_of

PROG = "memagent history"
CSV_HEADER = ("time", "pid", "start_time", "label", "rss_bytes", "vram_bytes")

EPILOG = ("Source: the daemon's RAM when it reaches back to --since (and no --file), else the recording "
          "(--file, or the daemon's flight recorder); --from forces one. Exit 0 done; 1 a PID or label with "
          "no points in the window (one line each), no recording, or the daemon failed; 2 no daemon (RAM) "
          "or a usage error.")

def add_parsers(sub: argparse._SubParsersAction[Parser], parents: Parents) -> None:
    p = sub.add_parser("history", parents=parents.client, help=help_of("history"),
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


def cmd_history(args: argparse.Namespace) -> int:
    if args.csv and args.json:
        raise UsageError(PROG, "--csv and --json: choose one", hint=True)
    from ..recordings.history import Query, csv_rows, gather, of_timeline, text_lines  # the reader: when it runs

    since, until = window(args, PROG)
    if args.source and args.origin == RAM:
        raise UsageError(PROG, "--file reads a recording: it goes with --from recording or auto", hint=True)
    query = Query(args.pids, args.label, since, until, bool(args.since or args.until), args.origin, args.source,
                  args.socket)
    result = gather(query, lambda: of_timeline(load_timeline(args, PROG, pids=args.pids, labels=args.label),
                                               args.source))
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
        out = csv.writer(sys.stdout, lineterminator="\n")
        out.writerow(CSV_HEADER)
        out.writerows(csv_rows(result))
    else:
        print("\n".join(text_lines(result)))
    for note in result.notes:
        print(f"{PROG}: {printable(note)}", file=sys.stderr)
    for f in result.failures:
        print(f"{PROG}: {printable(f.message)}", file=sys.stderr)
    return EXIT_FAILED if result.failures else EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"history": cmd_history}
