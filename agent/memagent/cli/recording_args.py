"""The flags of the commands that read a recording (``history``, ``report``, ``plot``):
``[FILE|DIR] [--since WHEN] [--until WHEN]``, read into a timeline by
:mod:`memagent.recordings.source`; a flag that does not parse is a usage error, one line."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from memproto import when
from memproto.text import printable

from .args import UsageError

if TYPE_CHECKING:  # the reader is imported when a command reads, not when the parser is built
    from ..recordings.timeline import Timeline

def add_source_arguments(parser: argparse.ArgumentParser, *, positional: bool = True) -> None:
    """``[FILE|DIR] [--since WHEN] [--until WHEN] [--pid PID …] [--label L …]``."""
    if positional:
        parser.add_argument("source", nargs="?", metavar="FILE|DIR",
                            help="a recording (memagent record -o), or a recorder's directory (default: the "
                                 "daemon's flight recorder)")
    parser.add_argument("--since", metavar="WHEN", help="from this time: 2h, 30m, 2026-11-30T14:00, @UNIX")
    parser.add_argument("--until", metavar="WHEN", help="up to this time (same forms)")


def window(args: argparse.Namespace, prog: str, now: float | None = None) -> tuple[float | None, float | None]:
    """``--since`` and ``--until`` as Unix seconds (a usage error, one line, if unreadable)."""
    try:
        return when.window(getattr(args, "since", None), getattr(args, "until", None),
                           time.time() if now is None else now)
    except ValueError as exc:
        raise UsageError(prog, str(exc)) from None


def load_timeline(args: argparse.Namespace, prog: str, *, pids: Iterable[int] = (),
                  labels: Iterable[str] = ()) -> Timeline:
    """The recording named by ``args``, cut to its window and processes, the damage skipped
    on stderr. One-line errors: :class:`UsageError` (flags),
    :class:`~memagent.recordings.source.RecordingUnavailable` (nothing readable)."""
    from ..recordings.source import read_timeline, source_paths

    since, until = window(args, prog)
    def tell(line: str) -> None:
        print(f"{prog}: {printable(line)}", file=sys.stderr)

    return read_timeline(source_paths(getattr(args, "source", None), getattr(args, "socket", None)),
                         since, until, pids=pids, labels=labels, on_damage=tell)
