"""Where ``memagent history``, ``report`` and ``plot`` read a recording from, in one place:
the ``FILE|DIR`` given, else the running daemon's flight recorder (``status.recording_dir``),
else the default one of this user (root: ``/var/lib/memagent/record``). Errors are one
line (:class:`RecordingUnavailable`); the damage a reader skipped is kept for the command
to print. The flags that name them: :mod:`memagent.cli.recording_args`."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from memproto.client_side import ClientError
from memproto.paths import user_socket
from memproto.recording import RecordingError, open_recording

from ..client import connect
from ..config import default_state_dir
from ..errors import RecordingUnavailable as RecordingUnavailable
from .timeline import Timeline, build_timeline

#: The recorder's directory inside the state directory (memagent.store.recorder).
RECORD_SUBDIR = "record"


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


def source_paths(source: str | None, socket: str | None) -> list[str]:
    """The paths to read (``source``, else the flight recorder of the daemon at ``socket``,
    else this user's), each one checked now so the error names it."""
    path = source or recorder_dir(socket)
    if not os.path.exists(path):
        raise RecordingUnavailable(f"no recording at {path}" + ("" if source else
                                   " (is the daemon's flight recorder on? memagent status says)"))
    if not os.access(path, os.R_OK | (os.X_OK if os.path.isdir(path) else 0)):
        raise RecordingUnavailable(f"cannot read the recording at {path}: permission denied "
                                   "(the daemon's recordings are its user's; memagent record -o FILE makes one "
                                   "of your own)")
    return [path]


def read_timeline(paths: list[str], since: float | None, until: float | None, *, pids: Iterable[int] = (),
                  labels: Iterable[str] = (), on_damage: Callable[[str], None] | None = None) -> Timeline:
    """The recording at ``paths``, cut to its window and processes; the damage a reader
    skipped (a segment that cannot be read, a damaged part of one, values that are NaN or
    infinite) is in its ``damage``, one line each, and told to ``on_damage`` as found (so
    that it is said even when nothing reads). Nothing readable: :class:`RecordingUnavailable`."""
    damage: list[str] = []

    def found(line: str) -> None:
        damage.append(line)
        if on_damage is not None:
            on_damage(line)

    try:
        frames = open_recording(paths, since=since, until=until, on_damage=found)
        timeline = build_timeline(frames, since=since, until=until, pids=pids, labels=labels)
    except RecordingError as exc:
        raise RecordingUnavailable(str(exc)) from None
    except OSError as exc:
        raise RecordingUnavailable(f"cannot read {exc.filename or paths[0]}: {exc.strerror or exc}") from None
    timeline.damage = damage
    return timeline
