"""Where ``memagent history``, ``report`` and ``plot`` read a recording from, in one place:
the ``FILE|DIR`` given, else the running daemon's flight recorder (``status.recording_dir``),
else the default one of this user (root: ``/var/lib/memagent/record``). Errors are one
line (:class:`RecordingUnavailable`), the damage a reader skipped goes to stderr."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable

from memproto.client_side import ClientError
from memproto.paths import user_socket
from memproto.recording import RecordingError, open_recording

from ..cli.args import UsageError
from ..client import connect
from ..config import default_state_dir
from .timeline import Timeline, build_timeline, parse_when

#: The recorder's directory inside the state directory (memagent.serve.recorder).
RECORD_SUBDIR = "record"
#: The last second of the year 9999 UTC: the latest time ``--since``/``--until`` may name.
LATEST = 253_402_300_799.0


class RecordingUnavailable(Exception):
    """No recording to read: the message says where it looked and what to do."""


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
    now = time.time() if now is None else now
    out: list[float | None] = []
    for flag in ("since", "until"):
        text = getattr(args, flag, None)
        try:
            out.append(None if text is None else parse_when(text, now))
        except ValueError as exc:
            raise UsageError(prog, f"--{flag}: {exc}") from None
        t = out[-1]
        if t is not None and not 0 <= t <= LATEST:  # else iso() of it fails (OverflowError), far past any recording
            raise UsageError(prog, f"--{flag}: {text!r} is before 1970 or after the year 9999")
    since, until = out
    if since is not None and until is not None and until < since:
        raise UsageError(prog, "--until is before --since")
    return since, until


def recorder_dir(socket: str | None) -> str:
    """The flight recorder of the daemon that answers, or this user's default one."""
    try:
        with connect(socket, timeout=5.0) as client:
            status = client.status()
        if status.recording_dir:
            return status.recording_dir
    except (ClientError, TimeoutError, OSError):
        pass  # no daemon (or none we may ask): the default place
    state = default_state_dir(user_socket())
    if state is None:
        raise RecordingUnavailable("no recording given, and no default state directory: give FILE|DIR")
    return os.path.join(state, RECORD_SUBDIR)


def source_paths(args: argparse.Namespace) -> list[str]:
    """The paths to read, each one checked now so the error names it."""
    path = getattr(args, "source", None) or recorder_dir(getattr(args, "socket", None))
    if not os.path.exists(path):
        raise RecordingUnavailable(f"no recording at {path}" + ("" if getattr(args, "source", None) else
                                   " (is the daemon's flight recorder on? memagent status says)"))
    if not os.access(path, os.R_OK | (os.X_OK if os.path.isdir(path) else 0)):
        raise RecordingUnavailable(f"cannot read the recording at {path}: permission denied "
                                   "(the daemon's recordings are its user's; memagent record -o FILE makes one "
                                   "of your own)")
    return [path]


def load_timeline(args: argparse.Namespace, prog: str, *, pids: Iterable[int] = (),
                  labels: Iterable[str] = ()) -> Timeline:
    """The recording named by ``args``, cut to its window and processes. One-line errors:
    :class:`UsageError` (flags), :class:`RecordingUnavailable` (nothing readable)."""
    since, until = window(args, prog)
    paths = source_paths(args)
    damage: list[str] = []
    try:
        frames = open_recording(paths, since=since, until=until, on_damage=damage.append)
        timeline = build_timeline(frames, since=since, until=until, pids=pids, labels=labels)
    except RecordingError as exc:
        raise RecordingUnavailable(str(exc)) from None
    except OSError as exc:
        raise RecordingUnavailable(f"cannot read {exc.filename or paths[0]}: {exc.strerror or exc}") from None
    timeline.damage = damage
    for line in damage:
        print(f"{prog}: {line}", file=sys.stderr)
    return timeline
