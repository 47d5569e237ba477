"""The textfile for node_exporter's textfile collector (``[metrics] textfile``,
docs/metrics.md): replaced whole, never seen half-written.

The exposition goes to a temporary file in the same directory (a name the collector
ignores: not ``*.prom``), created exclusively and without following a link (the
directory may be one others can write to), synced, then renamed over the file, and the
directory synced so the rename survives a crash. Runs in a worker thread: a slow disk's
fsync never holds the event loop, and the thread holds the GIL only between system calls.
"""

from __future__ import annotations

import contextlib
import os

#: The file's mode: node_exporter runs as another user and must read it.
MODE = 0o644


def temporary_path(path: str) -> str:
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.memagent-tmp")


def write_atomically(path: str, data: bytes) -> None:
    """``data`` as the new content of ``path``; OSError (the file left as it was) if it
    cannot be written."""
    tmp = temporary_path(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # left by a crash: O_EXCL below would refuse it forever
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, MODE)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, MODE)  # whatever the umask
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
