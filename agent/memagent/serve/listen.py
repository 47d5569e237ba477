"""The listening socket: its directory, its file, its mode and group.

The directory. Every entry from ``/`` down to the socket's directory must be owned by us
(the daemon's effective UID) or by root: a directory not writable by group or others
unless it is sticky (as ``/tmp`` is), or a symbolic link, whose target is checked the
same way. Then no other user can put a file, a link or a directory of their own at the
socket's path, before or after ``bind``. A directory that fails is refused
(:class:`SocketPathError`, naming it and why), never repaired. Missing directories are
created by us, mode 0700, or 0755 when the socket is meant for other users too (root's
daemon, e.g. ``/run/memagent``; a socket group), less the umask: the socket's own mode
and group are then the gate.

The file. Its mode is set on the socket itself before ``bind`` (``fchmod``: Linux
creates the file with the socket's mode, less the umask, which is also set to 0117
around ``bind``), its group with ``lchown``; nothing follows a link at the path. After
``bind`` the path must be a socket owned by us. A stale socket file of ours is replaced;
a live daemon on the path is :class:`DaemonAlreadyRunning`; anything else is refused.

The lock. A socket file can be deleted while its daemon runs; a second daemon would then
bind a new one beside it. So a daemon first takes an exclusive ``flock`` on
``<socket>.lock``, in the same checked directory, and holds it until it stops (the kernel
drops it when the daemon dies, SIGKILL included): a second daemon on the path finds it
held and refuses to start. The file is created without following links, mode 0600,
close-on-exec (py-spy and the hook do not inherit it); one that is not a regular file of
ours is refused. Nobody else can put one there first (the directory check), nor open
ours to hold the lock (0600).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import stat

from ..errors import DaemonAlreadyRunning, SocketPathError
from ..store.files import entry_status, open_lock_file

log = logging.getLogger(__name__)

SOCKET_MODE = 0o660
#: The lock file: only its daemon may open it, so only its daemon may hold the lock.
LOCK_MODE = 0o600
#: A directory we create: only us, or (0755) anyone may reach the socket.
PRIVATE_DIR_MODE = 0o700
SHARED_DIR_MODE = 0o755


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


def _owner(uid: int) -> str:
    return "root" if uid == 0 else f"uid {uid}"


def _trusted(euid: int) -> str:
    return _owner(euid) + ("" if euid == 0 else " or root")


def check_directory(directory: str, st: os.stat_result, euid: int) -> None:
    """Refuse a directory another user could change (``st`` is its ``lstat``)."""
    if stat.S_ISLNK(st.st_mode):
        raise SocketPathError(f"socket directory {directory} is a symbolic link of {_owner(st.st_uid)}, "
                              f"not of {_trusted(euid)}; not using it")
    if not stat.S_ISDIR(st.st_mode):
        raise SocketPathError(f"socket directory {directory} is not a directory; not using it")
    if st.st_uid not in (euid, 0):
        raise SocketPathError(f"socket directory {directory} is owned by uid {st.st_uid}, not by "
                              f"{_trusted(euid)}; not using it")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise SocketPathError(f"socket directory {directory} is writable by group or others "
                              f"(mode {stat.S_IMODE(st.st_mode):04o}) and not sticky; not using it")


def secure_directory(directory: str, mode: int = PRIVATE_DIR_MODE, *, _depth: int = 0) -> str:
    """``directory`` with its links resolved, after checking every entry on the way from
    ``/``: directories with :func:`check_directory`, links followed only when ours or
    root's; the missing directories are created with ``mode`` (less the umask)."""
    euid = os.geteuid()
    current = "/"
    for part in os.path.abspath(directory).strip("/").split("/"):
        if not part:
            continue
        entry = os.path.join(current, part)
        try:
            st = entry_status(entry)
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):  # raced: whoever made it is checked
                os.mkdir(entry, mode)
                log.info("created socket directory %s (mode %04o, less the umask)", entry, mode)
            st = entry_status(entry)
        if stat.S_ISLNK(st.st_mode) and st.st_uid in (euid, 0):
            if _depth >= 8:
                raise SocketPathError(f"socket directory {directory}: too many symbolic links")
            # A link in a checked directory, made by us or root: its target is checked too.
            current = secure_directory(os.path.realpath(entry), mode, _depth=_depth + 1)
            continue
        check_directory(entry, st, euid)
        current = entry
    return current


def prepare_path(path: str, dir_mode: int = PRIVATE_DIR_MODE) -> str:
    """Check (and make) the directory, refuse a live daemon or another's file, remove a
    stale socket file of ours. Returns the path to bind: the directory's links resolved."""
    real = os.path.join(secure_directory(os.path.dirname(path) or ".", dir_mode), os.path.basename(path))
    try:
        st = entry_status(real)
    except FileNotFoundError:
        return real
    if not stat.S_ISSOCK(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a socket"
        raise SocketPathError(f"{path} exists and is {kind}; not replacing it")
    if _daemon_listening(real):
        raise DaemonAlreadyRunning(path)
    if st.st_uid != os.geteuid():
        raise SocketPathError(f"{path} is a stale socket of {_owner(st.st_uid)}; not replacing it")
    log.info("replacing stale socket %s", path)
    with contextlib.suppress(FileNotFoundError):  # gone meanwhile: what we wanted
        os.unlink(real)
    return real


def _dir_mode(gid: int | None) -> int:
    """The mode of a socket directory we create: shared for root's daemon or a socket group."""
    return SHARED_DIR_MODE if os.geteuid() == 0 or gid is not None else PRIVATE_DIR_MODE


class DaemonLock:
    """The lock a daemon holds on ``<socket>.lock`` while it runs (see the module's doc)."""

    def __init__(self, fd: int, path: str, inode: int) -> None:
        self.fd = fd
        self.path = path
        self.inode = inode

    def release(self) -> None:
        """Remove the lock file (if still ours) while holding the lock, then let go: a
        daemon that opened it meanwhile finds the path changed once it gets the lock and
        starts over on a new file."""
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            if entry_status(self.path).st_ino == self.inode:
                os.unlink(self.path)
        os.close(self.fd)
        self.fd = -1


def lock_daemon(path: str, gid: int | None) -> DaemonLock:
    """Take the lock of the socket ``path`` (the directory checked, and made, as for the
    socket); :class:`DaemonAlreadyRunning` while another daemon holds it,
    :class:`SocketPathError` when the lock file is not ours to use."""
    try:
        directory = secure_directory(os.path.dirname(path) or ".", _dir_mode(gid))
    except OSError as exc:
        raise SocketPathError(f"cannot use {path}: {exc.strerror or exc}") from None
    lock = os.path.join(directory, os.path.basename(path) + ".lock")
    for _ in range(8):
        try:
            fd = open_lock_file(lock, LOCK_MODE)
        except OSError as exc:
            raise SocketPathError(f"cannot open the lock file {lock}: {exc.strerror or exc}; not using it") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise SocketPathError(f"lock file {lock} is not a regular file of ours (owner {_owner(st.st_uid)}); "
                                      "not using it")
            if stat.S_IMODE(st.st_mode) != LOCK_MODE:
                os.fchmod(fd, LOCK_MODE)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise DaemonAlreadyRunning(path) from None
            with contextlib.suppress(FileNotFoundError):
                if entry_status(lock).st_ino == st.st_ino:
                    return DaemonLock(fd, lock, st.st_ino)
        except OSError as exc:
            os.close(fd)
            raise SocketPathError(f"cannot lock {lock}: {exc.strerror or exc}") from None
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # its daemon stopped and removed it meanwhile: start over on the new one
    raise SocketPathError(f"cannot lock {lock}: it keeps being replaced")


def bind_socket(path: str, gid: int | None) -> tuple[socket.socket, int]:
    """A listening-ready socket bound at ``path`` (mode 0660, group ``gid``), and the
    inode of its file (so that only our own file is removed on the way out)."""
    euid = os.geteuid()
    try:
        real = prepare_path(path, _dir_mode(gid))
    except OSError as exc:
        raise SocketPathError(f"cannot use {path}: {exc.strerror or exc}") from None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.fchmod(sock.fileno(), SOCKET_MODE)  # the file bind creates gets this mode
        old = os.umask(0o117)
        try:
            sock.bind(real)
        finally:
            os.umask(old)
        st = entry_status(real)
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != euid:
            raise SocketPathError(f"{path} is not our socket after bind; not using it")
        if gid is not None:
            os.chown(real, -1, gid, follow_symlinks=False)
            st = entry_status(real)
        if stat.S_IMODE(st.st_mode) != SOCKET_MODE or (gid is not None and st.st_gid != gid):
            raise SocketPathError(f"{path} has mode {stat.S_IMODE(st.st_mode):04o} group {st.st_gid} "
                                  f"after bind, not {SOCKET_MODE:04o}{'' if gid is None else f' group {gid}'}")
        return sock, st.st_ino
    except OSError as exc:  # the path changed under us (a race): one line, not a traceback
        sock.close()
        raise SocketPathError(f"cannot bind {path}: {exc.strerror or exc}") from None
    except BaseException:
        sock.close()
        raise


def remove_socket(path: str, inode: int | None) -> None:
    """Remove the socket file, only if it is still ours (same inode)."""
    with contextlib.suppress(OSError):
        if entry_status(path).st_ino == inode:
            os.unlink(path)
