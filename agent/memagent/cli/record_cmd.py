"""``memagent record -o FILE [--duration S] [--pid PID…] [--force]``: a portable recording made
by any client, in the flight recorder's format (docs/recording.md), of what this client
may see (the daemon filters).

What the file holds and how it is written: :mod:`memagent.recordings.writer`.

It stops at ``--duration``, at Ctrl-C or SIGTERM (the file complete, exit 0), or when the
daemon goes away (the file complete up to then, one line, exit 1).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from memproto.client_side import ConnectionLost, DaemonTimeout

from ..client import connect
from ..prose import human_bytes
from .args import Parser, pid_arg, seconds_arg
from .exits import finish

PROG = "memagent record"
EPILOG = ("Stops at --duration, Ctrl-C or SIGTERM (exit 0), or when the daemon goes away (exit 1: the file holds "
          "what came before). Exit 2: no daemon, a usage error, or FILE exists (--force overwrites it). Read it "
          "with memagent history --file, report, plot, memtop --replay.")


def add_parser(sub: argparse._SubParsersAction[Parser], parents: list[Parser]) -> None:
    p = sub.add_parser("record", parents=parents, help="record the daemon's samples and events to a file",
                       description="Record what this client may see (samples, attach/exit/detach, alerts, "
                                   "headroom, stacks at peaks) to FILE, in the flight recorder's format.",
                       epilog=EPILOG)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the recording to write")
    p.add_argument("--duration", type=seconds_arg, metavar="SECONDS", help="stop after this long")
    p.add_argument("--pid", type=pid_arg, action="append", default=[], metavar="PID",
                   help="only this process (repeatable; default: every process you may see)")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")


class Stopper:
    """SIGINT and SIGTERM set a flag the loop reads between frames, instead of raising in
    the middle of a write."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Stopper:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._set)
        return self

    def _set(self, sig: int, _frame: FrameType | None) -> None:
        self.signal = sig

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def record(args: argparse.Namespace) -> tuple[dict[str, object], str]:
    from ..recordings.writer import (  # the writer: imported when the command runs, not for the parser
        REQUEST_TIMEOUT,
        RecordFailed,
        RecordingWriter,
        check_output,
        create,
        record_until,
    )

    check_output(args.output, args.force)
    started = time.monotonic()
    with connect(args.socket, timeout=REQUEST_TIMEOUT) as client:
        fd = create(args.output, args.force)
        rec = RecordingWriter(client, fd, args.output, args.pid)
        lost: str | None = None
        try:
            with Stopper() as stopper:
                try:
                    rec.begin()
                except (ConnectionLost, DaemonTimeout) as exc:
                    lost = f"the daemon went away ({exc})"
                else:
                    lost = record_until(rec, args.duration, lambda: stopper.signal is not None)
        finally:
            size = rec.close()
    seconds = round(time.monotonic() - started, 3)
    path = os.path.abspath(args.output)
    n = rec.counts
    done: dict[str, object] = {"file": path, "seconds": seconds, "frames": n.frames, "samples": n.samples,
                               "processes": len(n.processes), "bytes": size}
    line = (f"{path}: {seconds:.1f} s, {n.samples} samples, {n.frames} frames, {len(n.processes)} "
            f"process{'' if len(n.processes) == 1 else 'es'}, "
            f"{human_bytes(size)}")
    if lost is not None:
        raise RecordFailed(ConnectionLost.code, f"{lost} after {seconds:.1f} s; {path} holds what came before "
                           f"({n.samples} samples)")
    return done, line


def cmd_record(args: argparse.Namespace) -> int:
    return finish(args.json, PROG, lambda: record(args))


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"record": cmd_record}
