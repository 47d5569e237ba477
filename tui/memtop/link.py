"""The connection to the daemon: asyncio streams + memproto (:class:`DaemonLink`), and
what the app's connection worker does with it (:class:`Connector`). Widgets never see it.

:class:`DaemonLink` raises the client errors every client shares
(:mod:`memproto.client_side`): :class:`DaemonNotRunning` (:class:`NoDaemonSocket` when
not even the socket file is there), :class:`ConnectionLost` (and :class:`UntrustedDaemon`:
the socket is served by a UID we do not trust) and :class:`RequestFailed` (the daemon
refused the hello).

Which daemon: the first of its candidate paths that answers
(:func:`memproto.paths.socket_candidates`, as for every client: ``--socket`` or
``$MEMAGENT_SOCKET`` alone, else the system socket, then the user's), tried in order at
each attempt until one answers; that one is then the only path, followed across the
daemon's restarts.

Which agent memtop talks to (:data:`EmbeddedMode`): ``"always"`` its own embedded agent
(``--embedded``, ``--demo``); ``"never"`` only a daemon (``--no-embedded``); ``"auto"``
(the default) a daemon when a candidate's socket file is there at start, else an embedded
agent. The choice is made once: a daemon that goes away (restart, crash) is reconnected
to, with backoff (:data:`BACKOFF_FIRST` doubling to :data:`BACKOFF_MAX`), never replaced
by an embedded agent or by a daemon on another path.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from textual.message import Message

from memproto import (
    FrameBuffer,
    ProtocolError,
    encode,
    frame_bytes,
)
from memproto.client_side import (
    CannotConnect,
    ClientError,
    ConnectionLost,
    DaemonNotRunning,
    NoDaemonThere,
    RequestFailed,
    check_server,
    check_server_hello,
    client_hello,
    decode_from_server,
    denied_reason,
    no_daemon,
)
from memproto.frames import Error, Frame, Hello, History, ListProcesses, Status, Subscribe

from . import __version__
from .messages import FrameArrived, LinkDown, LinkUp

if TYPE_CHECKING:
    from memagent.embedded import EmbeddedAgent

SOFTWARE = f"memtop {__version__}"
STATUS_EVERY = 2.0
#: Seconds before the first retry after a failed connection; doubled up to BACKOFF_MAX.
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 2.0

EmbeddedMode = Literal["auto", "always", "never"]


class NoDaemonSocket(DaemonNotRunning):
    """Not even the socket file is there (DaemonNotRunning: it is, but nobody answers)."""


class DaemonLink:
    def __init__(self, path: str) -> None:
        self.path = path
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._buffer = FrameBuffer()
        self._pending: list[Frame] = []
        self._ids = itertools.count(1)

    async def open(self, timeout: float = 5.0) -> Hello:
        try:
            self._reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(self.path), timeout)
        except (FileNotFoundError, NotADirectoryError):
            raise NoDaemonSocket(self.path) from None
        except ConnectionRefusedError:
            raise DaemonNotRunning(self.path) from None
        except TimeoutError:
            raise
        except PermissionError as exc:  # its mode or group keeps us out: which group, and how to join it
            raise CannotConnect(self.path, denied_reason(self.path, exc.strerror or str(exc))) from None
        except OSError as exc:  # a path too long: as the CLI's
            raise CannotConnect(self.path, exc.strerror or str(exc)) from None
        self._writer = writer
        # Before a byte is sent: a daemon of root, of ours or of $MEMAGENT_DAEMON_UID, else
        # UntrustedDaemon (the connector shows it and retries; no embedded agent for it).
        check_server(writer.get_extra_info("socket"), self.path)
        self.send(client_hello(SOFTWARE))
        first = await asyncio.wait_for(self.recv(), timeout)
        if isinstance(first, Error):
            raise RequestFailed(first)
        return check_server_hello(first)

    def next_id(self) -> int:
        return next(self._ids)

    def send(self, frame: Frame) -> None:
        if self._writer is None or self._writer.is_closing():
            raise ConnectionLost("not connected")
        self._writer.write(frame_bytes(encode(frame)))

    async def recv(self) -> Frame:
        assert self._reader is not None
        while not self._pending:
            data = await self._reader.read(262144)
            if not data:
                raise ConnectionLost("the daemon closed the connection")
            self._pending.extend(decode_from_server(self._buffer.feed(data)))
        return self._pending.pop(0)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class Connector:
    """The app's connection worker: connect (to the agent :data:`EmbeddedMode` chose), ask
    for the current state and subscribe, relay every frame, and reconnect with backoff when
    the link drops. It only posts messages (:mod:`memtop.messages`); the app sends its
    requests on :attr:`link`."""

    def __init__(self, paths: str | Sequence[str], post: Callable[[Message], object], *,
                 allow_embedded: bool = True, embedded: EmbeddedMode = "auto", demo: bool = False,
                 embedded_interval: float = 0.5) -> None:
        #: The daemon's candidate paths, in order (one path: that one alone); once one
        #: answered, that one only.
        self.candidates: tuple[str, ...] = (paths,) if isinstance(paths, str) else tuple(paths)
        self.post = post
        #: "always" once an embedded agent is chosen; "auto" only until the first try.
        self.mode: EmbeddedMode = "always" if demo else embedded if allow_embedded else "never"
        self.demo = demo
        self.embedded_interval = embedded_interval
        #: The open link; None while disconnected.
        self.link: DaemonLink | None = None
        #: The agent started in-process; None: none.
        self.embedded: EmbeddedAgent | None = None
        #: Whether a link was ever up: a later failure is a lost daemon, not a missing one.
        self.ever_connected = False
        self._lock = threading.Lock()  # stop() may come from another thread (terminal lost)
        self._closed = False

    @property
    def path(self) -> str:
        """The daemon's path: the one chosen, or the first candidate until one answers."""
        return self.candidates[0]

    async def run(self) -> None:
        attempt, backoff = 0, BACKOFF_FIRST
        while True:
            reason = await self._connect_once(first=attempt == 0 and not self.ever_connected)
            if reason is None:  # it served, then the link dropped: retry at once
                attempt, backoff = 0, BACKOFF_FIRST
                continue
            attempt += 1
            self.post(LinkDown(reason, backoff, attempt, lost=self.ever_connected))
            await asyncio.sleep(backoff)
            backoff = min(BACKOFF_MAX, backoff * 2)

    async def _connect_once(self, *, first: bool) -> str | None:
        """One try: connect and serve until the link drops (None), or why it failed. Short
        enough for the header's status line (the CLI adds how to start a daemon)."""
        if self.mode == "always" and self.embedded is None:
            if self._closed:
                return "memtop is stopping"
            try:
                await asyncio.to_thread(self._start_embedded)
            except Exception as exc:  # noqa: BLE001 - whatever stops it is shown, then retried
                return f"cannot start an embedded agent: {exc or type(exc).__name__}"
            if self.embedded is None:
                return "memtop is stopping"
        embedded = self.embedded
        try:
            opened = await self._open_first((str(embedded.socket),) if embedded is not None else self.candidates)
        except (OSError, ClientError, ProtocolError, asyncio.TimeoutError) as exc:
            return str(exc) or type(exc).__name__
        if not isinstance(opened, DaemonLink):
            if first and self.mode == "auto" and all(isinstance(f, NoDaemonSocket) for f in opened):
                self.mode = "always"  # no daemon at start: an agent of our own, for good
                return await self._connect_once(first=False)
            why = no_daemon(opened)
            if isinstance(why, DaemonNotRunning):  # a socket nobody answers on: (re)starting
                return f"no memagent daemon at {why.where}"
            return str(why)
        link = opened
        if embedded is None:
            self.candidates = (link.path,)  # this daemon, from now on: followed, never replaced
        self.link, self.ever_connected = link, True
        self.post(LinkUp(link.path, embedded is not None))
        try:
            reason = await self._serve(link)
        finally:
            self.link = None
            link.close()
        self.post(LinkDown(reason, 0.0, 0, lost=True))
        return None

    @staticmethod
    async def _open_first(paths: Sequence[str]) -> DaemonLink | list[NoDaemonThere]:
        """A link to the first of ``paths`` that answers, else why each did not (nothing
        there, nobody listening, not for us). A daemon that answers but is refused or
        refuses us ends the walk: its error is raised, never hidden behind the next path."""
        failures: list[NoDaemonThere] = []
        for path in paths:
            link = DaemonLink(path)
            try:
                await link.open()
            except (DaemonNotRunning, CannotConnect) as exc:
                link.close()
                failures.append(exc)
                continue
            except BaseException:
                link.close()
                raise
            return link
        return failures

    def stop(self) -> None:
        """Stop the embedded agent and its demo fleet, if one was started. From any thread;
        a second caller returns once the first is done."""
        with self._lock:
            self._closed = True
            agent, self.embedded = self.embedded, None
            if agent is not None:
                agent.stop()

    def _start_embedded(self) -> None:
        """In a thread: start the embedded agent, unless memtop stopped meanwhile."""
        from memagent.embedded import start_embedded

        agent = start_embedded(interval=self.embedded_interval, demo=self.demo)
        with self._lock:
            if not self._closed:
                self.embedded = agent
                return
        agent.stop()

    async def _serve(self, link: DaemonLink) -> str:
        """Ask for the current state, subscribe, then relay frames until the link drops;
        returns why it dropped."""
        for frame in (ListProcesses(link.next_id()), History(link.next_id()), Status(link.next_id()),
                      Subscribe(link.next_id())):
            link.send(frame)
        poller = asyncio.ensure_future(self._poll_status(link))
        try:
            while True:
                self.post(FrameArrived(await link.recv()))
        except (OSError, ConnectionLost, ProtocolError) as exc:
            return str(exc) or type(exc).__name__
        finally:
            poller.cancel()

    async def _poll_status(self, link: DaemonLink) -> None:
        with contextlib.suppress(ConnectionLost, OSError):
            while True:
                await asyncio.sleep(STATUS_EVERY)
                link.send(Status(link.next_id()))
