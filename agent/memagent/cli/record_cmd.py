"""``memagent record -o FILE [--duration S] [--pid PID…] [--force]``: a portable recording made
by any client, in the flight recorder's format (docs/recording.md), of what this client
may see (the daemon filters).

What the file holds and how it is written, and the loop: :mod:`memagent.recordings.writer`.

It stops at ``--duration``, at Ctrl-C or SIGTERM (the file complete, exit 0), or when the
daemon goes away (the file complete up to then, one line, exit 1).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from .args import Parents, Parser, add_selection_arguments, seconds_arg
from .exits import finish
from .table import help_of

PROG = "memagent record"
EPILOG = ("Stops at --duration, Ctrl-C or SIGTERM (exit 0), or when the daemon goes away (exit 1: the file holds "
          "what came before). Exit 2: no daemon, a usage error, or FILE exists (--force overwrites it). Read it "
          "with memagent history --file, report, plot, memtop --replay.")


def add_parsers(sub: argparse._SubParsersAction[Parser], parents: Parents) -> None:
    p = sub.add_parser("record", parents=parents.client, help=help_of("record"),
                       description="Record what this client may see (samples, attach/exit/detach, alerts, "
                                   "headroom, stacks at peaks) to FILE, in the flight recorder's format.",
                       epilog=EPILOG)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the recording to write")
    p.add_argument("--duration", type=seconds_arg, metavar="SECONDS", help="stop after this long")
    add_selection_arguments(p, label=False,
                            pid_help="only this process (repeatable; default: every process you may see)")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")


def cmd_record(args: argparse.Namespace) -> int:
    from ..recordings.writer import record  # the writer: imported when the command runs, not for the parser

    return finish(args.json, PROG, lambda: record(args.socket, args.output, args.force, args.pid, args.duration))


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"record": cmd_record}
