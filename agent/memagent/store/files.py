"""The small file helpers the other rooms call, so that opening and inspecting files
stays in two rooms of the agent (``memagent.proc`` for the kernel's, ``memagent.store``
for the daemon's own; tests/test_architecture.py):

* :func:`write_atomically`: the textfile for node_exporter's textfile collector
  (``[metrics] textfile``, docs/metrics.md), replaced whole, never seen half-written. The
  exposition goes to a temporary file in the same directory (a name the collector
  ignores: not ``*.prom``), created exclusively and without following a link (the
  directory may be one others can write to), synced, then renamed over the file, and
  the directory synced so the rename survives a crash. It runs in a worker thread: a slow
  disk's fsync never holds the event loop, and the thread holds the GIL only between
  system calls.
* :func:`entry_status` and :func:`open_lock_file`: the daemon's socket file, its
  directories and its lock file (``memagent.serve.listen`` decides what to trust).
"""

from __future__ import annotations

import contextlib
import os

#: The textfile's mode: node_exporter runs as another user and must read it.
MODE = 0o644


def entry_status(path: str) -> os.stat_result:
    """The status of ``path`` itself, a symbolic link not followed (``lstat``): whoever
    checks an entry's owner and mode must see the link, not what it points to."""
    return os.lstat(path)


def open_lock_file(path: str, mode: int) -> int:
    """A descriptor on the lock file ``path``, created with ``mode`` if missing, read and
    write, never through a link, close-on-exec (py-spy and the hooks do not inherit it),
    and without blocking (a FIFO planted in a sticky directory must not hang the start)."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)


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
