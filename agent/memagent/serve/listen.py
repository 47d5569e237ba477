"""The listening socket: its directory, its file, its mode and group.

Socket file: created with mode 0660 (umask set around ``bind`` so it is never wider),
optionally chowned to a group whose members may connect. A stale file left by a dead
daemon is replaced; a live daemon on the path makes :func:`bind_socket` fail.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat

from ..errors import DaemonAlreadyRunning, SocketPathError

log = logging.getLogger(__name__)


def _daemon_listening(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        # e.g. EACCES: someone's socket we cannot even probe; do not replace it.
        return True
    finally:
        probe.close()


def prepare_path(path: str) -> None:
    """Make the directory, refuse a live daemon, remove a stale socket file."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketPathError(f"{path} exists and is not a socket; not replacing it")
    if _daemon_listening(path):
        raise DaemonAlreadyRunning(path)
    log.info("replacing stale socket %s", path)
    os.unlink(path)


def bind_socket(path: str, gid: int | None) -> tuple[socket.socket, int]:
    """A listening-ready socket bound at ``path`` (mode 0660, group ``gid``), and the
    inode of its file (so that only our own file is removed on the way out)."""
    prepare_path(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o117)
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        if gid is not None:
            os.chown(path, -1, gid)
        os.chmod(path, 0o660)
        return sock, os.stat(path).st_ino
    except BaseException:
        sock.close()
        raise


def remove_socket(path: str, inode: int | None) -> None:
    """Remove the socket file, only if it is still ours (same inode)."""
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == inode:
            os.unlink(path)
