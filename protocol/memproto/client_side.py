"""What every client does the same way, sans I/O: the hello it sends, the check of the
daemon's hello, and decoding what the daemon pushes while ignoring frame types a newer
daemon may add, the check of who serves the socket, and the errors a client raises. The
blocking CLI client and memtop's asyncio link both use it.

Who serves: right after ``connect``, before the hello, a client reads the server's UID
from the kernel (``SO_PEERCRED``: the listener's credentials, which it cannot forge) and
talks only to root, to its own UID, or to the UID named by ``$MEMAGENT_DAEMON_UID`` (a
daemon run as a dedicated user); anyone else may have put their own listener at the path.
"""

from __future__ import annotations

import grp
import os
import pwd
import socket
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from .codec import UnknownFrameType, decode
from .errors import ProtocolError
from .frames import Error, Frame, Hello
from .version import PROTOCOL_MAJOR, PROTOCOL_VERSION


def client_hello(software: str) -> Hello:
    return Hello(list(PROTOCOL_VERSION), "client", software)


def check_server_hello(frame: Frame) -> Hello:
    """The daemon's first frame, if it is a hello of our major version; else ProtocolError.
    (An ``Error`` frame is the caller's to report, before calling this.)"""
    if not isinstance(frame, Hello):
        raise ProtocolError(f"expected hello, got {frame.TYPE}")
    if frame.version[0] != PROTOCOL_MAJOR:
        raise ProtocolError(f"daemon speaks protocol v{frame.version[0]}, this client v{PROTOCOL_MAJOR}")
    return frame


#: Names one more UID (a number or a user name) whose daemon clients trust.
TRUST_ENV = "MEMAGENT_DAEMON_UID"


def check_server_uid(server_uid: int, my_uid: int, trusted: Iterable[int] = (), path: str = "") -> None:
    """Accept a daemon run by root, by ``my_uid`` or by one of ``trusted``; else
    :class:`UntrustedDaemon`."""
    extra = tuple(trusted)
    if server_uid not in (0, my_uid, *extra):
        raise UntrustedDaemon(path, server_uid, my_uid, extra)


def trusted_uids(environ: Mapping[str, str] = os.environ) -> tuple[int, ...]:
    """The UID ``$MEMAGENT_DAEMON_UID`` names, if set (a number or a user name);
    ValueError if it names no user."""
    value = environ.get(TRUST_ENV, "").strip()
    if not value:
        return ()
    if value.isdigit():
        return (int(value),)
    try:
        return (pwd.getpwnam(value).pw_uid,)
    except KeyError:
        raise ValueError(f"{TRUST_ENV}={value!r} names no user") from None


_UCRED = struct.Struct("3i")


def peer_ucred(sock: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of a connected Unix socket: the
    kernel's ``SO_PEERCRED``, which the peer cannot forge (a client's as of ``connect``, a
    daemon's as of ``listen``). Both sides of the socket read it here."""
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return int(pid), int(uid), int(gid)


def peer_uid(sock: socket.socket) -> int:
    """The UID of the process at the other end (for a client: the daemon's)."""
    return peer_ucred(sock)[1]


def check_server(sock: socket.socket, path: str) -> int:
    """Check who serves ``sock`` (connected to ``path``) against root, our effective UID
    and ``$MEMAGENT_DAEMON_UID``; returns the daemon's UID or raises :class:`UntrustedDaemon`."""
    uid, me = peer_uid(sock), os.geteuid()
    if uid in (0, me):
        return uid
    try:
        trusted = trusted_uids()
    except ValueError as exc:
        raise UntrustedDaemon(path, uid, me, note=str(exc)) from None
    check_server_uid(uid, me, trusted, path)
    return uid


def decode_from_server(payloads: Iterable[bytes]) -> list[Frame]:
    """Decode pushed frames; a type this version does not know is skipped by design."""
    frames = []
    for payload in payloads:
        try:
            frames.append(decode(payload))
        except UnknownFrameType:
            continue
    return frames


# --------------------------------------------------------------------------- errors


class ClientErrorCode:
    """The ``code`` of a :class:`ClientError` that the client found itself (the daemon's
    are :class:`~memproto.vocabulary.ErrorCode`, with underscores; these have hyphens, so
    the two never collide). ``memagent --json`` prints them in its error object."""

    DAEMON_NOT_RUNNING: Final = "daemon-not-running"
    CANNOT_CONNECT: Final = "cannot-connect"
    CONNECTION_LOST: Final = "connection-lost"
    UNTRUSTED_DAEMON: Final = "untrusted-daemon"
    TIMEOUT: Final = "timeout"
    BAD_REPLY: Final = "bad-reply"


class ClientError(Exception):
    """Base of what a client (the CLI's or memtop's) raises about its daemon."""

    code: str = ClientErrorCode.CONNECTION_LOST


def either(paths: Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``: the paths a client tried, for one line."""
    return paths[-1] if len(paths) < 2 else f"{', '.join(paths[:-1])} or {paths[-1]}"


class DaemonNotRunning(ClientError):
    """Nothing listens on the socket path (``path``), or on any of the paths ``tried``
    (:func:`~memproto.paths.socket_candidates`; ``path`` is then the first)."""

    code = ClientErrorCode.DAEMON_NOT_RUNNING

    def __init__(self, path: str, tried: Sequence[str] = ()) -> None:
        self.path = path
        self.tried: tuple[str, ...] = tuple(tried) or (path,)
        #: "no memagent daemon at" what: the path, or every path tried.
        self.where = either(self.tried)
        super().__init__(f"no memagent daemon at {self.where} (start one with: memagent daemon)")


class ConnectionLost(ClientError):
    """The daemon closed the connection, or the link is not open."""

    code = ClientErrorCode.CONNECTION_LOST


class CannotConnect(ConnectionLost):
    """Something is at the socket path but ``connect`` failed for another reason than
    "nobody listens": permission denied, a path too long for ``AF_UNIX``. (A
    :class:`ConnectionLost`: the link is not open.)"""

    code = ClientErrorCode.CANNOT_CONNECT

    def __init__(self, path: str, reason: str, also: str = "") -> None:
        self.path = path
        self.reason = reason
        #: What the other paths tried said, if any (:func:`no_daemon`).
        self.also = also
        super().__init__(f"cannot connect to {path}: {reason}" + (f"; {also}" if also else ""))


def denied_reason(path: str, strerror: str, *, stat: Callable[[str], os.stat_result] = os.stat,
                  groups: Callable[[], list[int]] = os.getgroups, user: str | None = None) -> str:
    """Why ``connect`` to ``path`` was refused, in words that say what to do: the group
    that may connect (the socket's, else its directory's, as the daemon's ``socket_group``
    sets them) and the command an administrator adds a user to it with, or that this
    session predates its membership (issue 28: "Permission denied" alone left a user
    guessing). ``strerror`` alone when the group cannot be told."""
    gid = None
    for where in (path, os.path.dirname(path) or "."):
        try:
            gid = stat(where).st_gid
            break
        except OSError:
            continue
    if gid is None or gid == 0:
        return strerror
    try:
        group = grp.getgrgid(gid)
    except KeyError:
        return strerror
    name = user or _user_name()
    if gid in groups():
        return f"{strerror} (you are in group {group.gr_name}: the socket's mode or a directory above it refuses it)"
    if name in group.gr_mem:
        return (f"{strerror}: connecting takes group {group.gr_name}, which you were added to after this session "
                f"began (log in again, or: newgrp {group.gr_name})")
    return (f"{strerror}: connecting takes group {group.gr_name} (an administrator adds you with: "
            f"usermod -aG {group.gr_name} {name}; then log in again)")


def _user_name() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


class DaemonTimeout(ClientError, TimeoutError):
    """Something accepted the connection but did not answer in time. (A
    :class:`TimeoutError` too, as the socket's own.)"""

    code = ClientErrorCode.TIMEOUT

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"no answer in time from the daemon at {path}")


#: Why a candidate path served no daemon: nothing there, or not for us.
NoDaemonThere = DaemonNotRunning | CannotConnect


def no_daemon(failures: Sequence[NoDaemonThere]) -> NoDaemonThere:
    """The one error a client reports when none of the paths it tried answered (one
    failure per path, in order), in one line that names them all: the failure itself for
    one path; else a :class:`CannotConnect` when a path could not be connected to (the
    first; the others follow it), else a :class:`DaemonNotRunning` over every path."""
    if len(failures) == 1:
        return failures[0]
    refused = [f for f in failures if isinstance(f, CannotConnect)]
    absent = [f.path for f in failures if isinstance(f, DaemonNotRunning)]
    if not refused:
        return DaemonNotRunning(absent[0], absent)
    first = refused[0]
    others = [f"cannot connect to {f.path}: {f.reason}" for f in refused[1:]]
    others += [f"no memagent daemon at {either(absent)}"] if absent else []
    return CannotConnect(first.path, first.reason, "; ".join(others))


class RequestFailed(ClientError):
    """The daemon answered with an error frame (a request's, or a refusal to talk);
    ``code`` is the frame's (:class:`~memproto.vocabulary.ErrorCode`)."""

    def __init__(self, error: Error) -> None:
        self.code = error.code
        super().__init__(error.message)


class UntrustedDaemon(ConnectionLost):
    """The socket is served by a UID the client does not trust: it hung up before the
    hello. (A :class:`ConnectionLost`: the link is not open, and whatever handles a lost
    link, the CLI's exit 1 or memtop's retry, handles this too.)"""

    code = ClientErrorCode.UNTRUSTED_DAEMON

    def __init__(self, path: str, server_uid: int, my_uid: int, trusted: tuple[int, ...] = (),
                 note: str = "") -> None:
        self.path = path
        self.server_uid = server_uid
        who = ", ".join(["root", *([f"uid {my_uid}"] if my_uid else []),
                         *(f"uid {u} ({TRUST_ENV})" for u in trusted)])
        hint = note or f"set {TRUST_ENV} to trust another owner"
        super().__init__(f"refusing the daemon at {path}: it runs as uid {server_uid} (trusted: {who}); {hint}")
