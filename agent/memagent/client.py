"""A small blocking client of the daemon, for the command line, scripts and tests.

It handshakes, sends requests with increasing ids and waits for the reply with the same
id; events that arrive meanwhile are kept for :meth:`Client.events`. It raises the
client errors of :mod:`memproto.client_side`, the same ones memtop's link raises.

:func:`connect` finds the daemon as every client does: the first of
:func:`memproto.paths.socket_candidates` that answers; when none does, one error naming
every path tried.
"""

from __future__ import annotations

import builtins
import itertools
import socket
from collections import deque
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from memproto import (
    FrameBuffer,
    ProtocolError,
    encode,
    frame_bytes,
    frames,
)
from memproto.client_side import (
    CannotConnect,
    ConnectionLost,
    DaemonNotRunning,
    DaemonTimeout,
    NoDaemonThere,
    RequestFailed,
    check_server,
    check_server_hello,
    client_hello,
    decode_from_server,
    denied_reason,
    no_daemon,
)
from memproto.paths import socket_candidates

from . import SOFTWARE

if TYPE_CHECKING:
    # Requests and replies are named through ``frames`` where used: each one's module is
    # imported at its first use (``memagent ls`` creates the classes of ``list`` alone).
    from memproto.frames import AttachOk, DetachOk, Frame, Hello, HistoryOk, ResetPeaksOk, StackOk
    from memproto.records import DaemonStatus, ProcessInfo

R = TypeVar("R", bound="Frame")


def connect(explicit: str | None = None, timeout: float | None = 10.0,
            candidates: Sequence[str] | None = None) -> Client:
    """A :class:`Client` of the first daemon that answers among ``candidates`` (by default
    :func:`~memproto.paths.socket_candidates` of ``explicit``: ``--socket`` or
    ``$MEMAGENT_SOCKET`` alone, else the system socket, then the per-user paths).

    A path with nothing there, no listener, or a socket we may not connect to (its mode or
    group) is passed over; when every path is, :func:`~memproto.client_side.no_daemon`
    names them all (:class:`DaemonNotRunning` or :class:`CannotConnect`). A daemon that
    answers but is refused (:class:`~memproto.client_side.UntrustedDaemon`), refuses us,
    or does not answer in time ends the search: its error is raised, never hidden behind
    the next path."""
    failures: list[NoDaemonThere] = []
    for path in candidates or socket_candidates(explicit):
        try:
            return Client(path, timeout=timeout)
        except (DaemonNotRunning, CannotConnect) as exc:
            failures.append(exc)
        except PermissionError as exc:
            failures.append(CannotConnect(path, denied_reason(path, exc.strerror or str(exc))))
    raise no_daemon(failures)


class Client:
    def __init__(self, path: str, timeout: float | None = 10.0) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
            self._sock.close()
            raise DaemonNotRunning(path) from None
        except PermissionError:  # callers tell this one apart (the CLI reports it as a CannotConnect)
            self._sock.close()
            raise
        except OSError as exc:  # e.g. a path too long for AF_UNIX: one line for the user, not a traceback
            self._sock.close()
            raise CannotConnect(path, exc.strerror or str(exc)) from None
        try:
            check_server(self._sock, path)  # before a byte is sent: is it root's, ours?
        except BaseException:
            self._sock.close()
            raise
        self._buffer = FrameBuffer()
        self._pending: deque[Frame] = deque()
        self._ids = itertools.count(1)
        self.events: deque[Frame] = deque()
        self.server_hello = self._handshake()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def fileno(self) -> int:
        """The socket's descriptor, to wait on it with others (``select``); see :attr:`buffered`."""
        return self._sock.fileno()

    @property
    def buffered(self) -> bool:
        """Whether frames already read wait in :meth:`recv` (the socket may then be silent)."""
        return bool(self._pending)

    def set_timeout(self, timeout: float | None) -> None:
        """How long :meth:`recv` and a request wait from now on (``memagent record`` waits a
        quarter of a second for a frame, so that it flushes and stops on time)."""
        self._sock.settimeout(timeout)

    def send(self, frame: Frame) -> None:
        try:
            self._sock.sendall(frame_bytes(encode(frame)))
        except (BrokenPipeError, ConnectionResetError):
            raise ConnectionLost(f"the daemon at {self.path} closed the connection") from None
        except TimeoutError:
            raise DaemonTimeout(self.path) from None

    def recv(self) -> Frame:
        """The next frame from the daemon (blocking; honours the socket timeout:
        :class:`~memproto.client_side.DaemonTimeout`, a :class:`TimeoutError`)."""
        while not self._pending:
            try:
                data = self._sock.recv(65536)
            except ConnectionResetError:
                data = b""
            except TimeoutError:
                raise DaemonTimeout(self.path) from None
            if not data:
                raise ConnectionLost(f"the daemon at {self.path} closed the connection")
            self._pending.extend(decode_from_server(self._buffer.feed(data)))
        return self._pending.popleft()

    def _handshake(self) -> Hello:
        try:
            self.send(client_hello(SOFTWARE))
        except ConnectionLost:
            pass  # a daemon that refuses us (busy) may close first: its reason is still to read
        frame = self.recv()
        if isinstance(frame, frames.Error):
            raise RequestFailed(frame)
        return check_server_hello(frame)

    def request(self, frame: Frame, expect: type[R]) -> R:
        self.send(frame)
        want = getattr(frame, "id", None)
        while True:
            reply = self.recv()
            if isinstance(reply, frames.Error) and (reply.id == want or reply.id is None):
                raise RequestFailed(reply)
            if getattr(reply, "id", object()) == want and not isinstance(reply, frames.Hello):
                if not isinstance(reply, expect):
                    raise ProtocolError(f"expected {expect.TYPE}, got {reply.TYPE}")
                return reply
            self.events.append(reply)

    def _id(self) -> int:
        return next(self._ids)

    # ------------------------------------------------------------------ requests

    def attach(self, pids: list[int], label: str | None = None, children: bool = False, *,
               cgroup: str | None = None, unit: str | None = None, container: str | None = None) -> AttachOk:
        return self.request(frames.Attach(self._id(), pids, label, children, cgroup, unit, container), frames.AttachOk)

    def detach(self, pids: list[int], exited: bool = False, *,
               cgroup: str | None = None, unit: str | None = None, container: str | None = None) -> DetachOk:
        return self.request(frames.Detach(self._id(), pids, exited, cgroup, unit, container), frames.DetachOk)

    def reset_peaks(self, pids: list[int], kernel: bool = False) -> ResetPeaksOk:
        return self.request(frames.ResetPeaks(self._id(), pids, kernel), frames.ResetPeaksOk)

    def list(self) -> list[ProcessInfo]:
        return self.request(frames.ListProcesses(self._id()), frames.ListOk).processes

    def status(self) -> DaemonStatus:
        return self.request(frames.Status(self._id()), frames.StatusOk).status

    def history(self, pids: builtins.list[int] | None = None, seconds: float | None = None) -> HistoryOk:
        return self.request(frames.History(self._id(), pids or [], seconds), frames.HistoryOk)

    def stack(self, pid: int, fresh: bool = True) -> StackOk:
        return self.request(frames.Stack(self._id(), pid, fresh), frames.StackOk)

    def subscribe(self) -> None:
        self.request(frames.Subscribe(self._id()), frames.Ack)

    def stream(self) -> Iterator[Frame]:
        """Events and samples, first those that arrived during earlier requests."""
        while True:
            if self.events:
                yield self.events.popleft()
            else:
                yield self.recv()
