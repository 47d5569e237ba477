"""memtop's command line: the arguments, then the app.

:func:`entry` is the console script's target. The app is imported only once the arguments
are parsed, so ``memtop --help`` does not load Textual.
"""

from __future__ import annotations

import argparse
import logging
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memtop", description="The peak memory offenders on this box, live.")
    parser.add_argument("--socket", metavar="PATH", help="daemon socket (same resolution as memagent)")
    parser.add_argument("--no-embedded", action="store_true",
                        help="never start an embedded agent; wait for a daemon instead")
    parser.add_argument("--demo", action="store_true", help="start a demo fleet under an embedded agent")
    parser.add_argument("--interval", type=float, default=0.5, help="embedded agent's sample interval (0.5)")
    return parser


def entry(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from .app import MemtopApp

    # An embedded agent logs like the daemon; on a full-screen terminal those lines would
    # tear the display. What it reports (alerts, states) is on the screen anyway.
    agent_log = logging.getLogger("memagent")
    agent_log.addHandler(logging.NullHandler())
    agent_log.propagate = False
    app = MemtopApp(args.socket, allow_embedded=not args.no_embedded, demo=args.demo,
                    embedded_interval=args.interval)
    app.run()
    sys.exit(app.return_code or 0)


if __name__ == "__main__":
    entry()
