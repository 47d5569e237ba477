"""memtop's command line: the arguments, the terminal check, then the app.

:func:`entry` is the console script's target. The app is imported only once the arguments
are parsed and a terminal is there, so ``memtop --help`` does not load Textual.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from typing import TYPE_CHECKING

from memproto import when
from memproto.paths import SYSTEM_SOCKET

from . import __version__
from .replay_data import SPEED_MAX, SPEED_MIN, check_recording
from .terminal import HANGUP_EXIT, NO_TERMINAL, TerminalWatch, has_terminal

if TYPE_CHECKING:
    from .app import MemtopApp
    from .link import EmbeddedMode



def _interval(text: str) -> float:
    """The embedded agent's interval: the daemon's range (memagent.config.schema) for the
    same key; checked here, so a bad value is a usage error before the screen opens."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or not 0.01 <= value <= 60:
        raise argparse.ArgumentTypeError(f"not 0.01 to 60 seconds: {text!r}")
    return value


def _speed(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or not SPEED_MIN <= value <= SPEED_MAX:
        raise argparse.ArgumentTypeError(f"not {SPEED_MIN:g} to {SPEED_MAX:g}: {text!r}")
    return value


def _path(value: str) -> str:
    if not value:  # would mean "no --socket": say so instead
        raise argparse.ArgumentTypeError("an empty path")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memtop", description="The peak memory offenders on this box, live.",
        epilog=f"The daemon: --socket, else $MEMAGENT_SOCKET, else the first that answers of {SYSTEM_SOCKET} "
               "and the per-user paths (as memagent's commands). Without --embedded or --no-embedded: that "
               "daemon if a socket file of one is there at start (followed across its restarts), else an "
               "embedded agent.")
    parser.add_argument("--version", action="version", version=f"memtop {__version__}")
    parser.add_argument("--socket", type=_path, metavar="PATH",
                        help=f"daemon socket (default: $MEMAGENT_SOCKET, else {SYSTEM_SOCKET}, else per user)")
    agent = parser.add_mutually_exclusive_group()
    agent.add_argument("--embedded", action="store_true",
                       help="always run an agent of its own, even where a daemon runs")
    agent.add_argument("--no-embedded", action="store_true",
                       help="never start an embedded agent; wait for a daemon instead")
    parser.add_argument("--demo", action="store_true", help="start a demo fleet under an embedded agent")
    parser.add_argument("--interval", type=_interval, default=None,
                        help="embedded agent's sample interval, 0.01 to 60 seconds (0.5)")
    replay = parser.add_argument_group("replay", "play a recording (the daemon's flight recorder, or "
                                       "`memagent record -o FILE`) on the same screens; no daemon needed")
    replay.add_argument("--replay", metavar="FILE|DIR", type=_path,
                        help="a recording's segment file, or a directory of segments (the daemon's)")
    replay.add_argument("--speed", type=_speed, default=None,
                        help=f"start speed, {SPEED_MIN:g} to {SPEED_MAX:g} (1); then + and - double and halve it")
    replay.add_argument("--since", metavar="WHEN",
                        help="start at this time (2h, 30m, 2026-11-30T14:00, @UNIX; as memagent report's)")
    replay.add_argument("--until", metavar="WHEN", help="end at this time (same forms)")
    return parser


def _replay_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--replay plays a file: the options that choose or tune an agent make no sense with it."""
    if args.replay is None:
        given = [flag for flag in ("speed", "since", "until") if getattr(args, flag) is not None]
        if given:
            parser.error(f"--{given[0]} is the replay's: only with --replay")
        return
    live = [flag for flag, given in (("--embedded", args.embedded), ("--no-embedded", args.no_embedded),
                                     ("--demo", args.demo), ("--socket", args.socket is not None),
                                     ("--interval", args.interval is not None)) if given]
    if live:
        parser.error(f"--replay plays a recording, without an agent: not with {live[0]}")


def _terminal_lost(app: MemtopApp) -> None:
    """The terminal went away (watch thread): the agent and fleet first, then the app."""
    app.stop_agent()
    app.exit_from_thread(HANGUP_EXIT)


def entry(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.demo and args.no_embedded:
        parser.error("--demo runs an embedded agent: not with --no-embedded")
    _replay_usage(parser, args)
    since = until = None
    if args.replay is not None:  # before the screen: a file that does not play is one line
        try:
            since, until = when.window(args.since, args.until, time.time())
        except ValueError as exc:
            parser.error(str(exc))
        why = check_recording(args.replay, since, until)
        if why is not None:
            print(f"memtop: {why}", file=sys.stderr)
            sys.exit(2)
    if not has_terminal():
        print(NO_TERMINAL, file=sys.stderr)
        sys.exit(2)
    from .app import MemtopApp

    # An embedded agent logs like the daemon; on a full-screen terminal those lines would
    # tear the display. What it reports (alerts, states) is on the screen anyway.
    agent_log = logging.getLogger("memagent")
    agent_log.addHandler(logging.NullHandler())
    agent_log.propagate = False
    mode: EmbeddedMode = "always" if args.embedded or args.demo else "never" if args.no_embedded else "auto"
    app: MemtopApp
    if args.replay is not None:
        from .replay import ReplayApp

        app = ReplayApp(args.replay, speed=args.speed or 1.0, since=since, until=until)
    else:
        app = MemtopApp(args.socket, embedded=mode, demo=args.demo, embedded_interval=args.interval or 0.5)
    with TerminalWatch(lambda: _terminal_lost(app)):
        app.run()
    sys.exit(app.return_code or 0)


if __name__ == "__main__":
    entry()
