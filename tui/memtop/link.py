"""The connection to the daemon: asyncio streams + memproto (:class:`DaemonLink`), and
what the app's connection worker does with it (:class:`Connector`). Widgets never see it.

:class:`DaemonLink` raises the client errors every client shares
(:mod:`memproto.client_side`): :class:`DaemonNotRunning`, :class:`ConnectionLost` (and
:class:`UntrustedDaemon`: the socket is served by a UID we do not trust) and
:class:`RequestFailed` (the daemon refused the hello).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

from textual.message import Message

from memproto import (
    FrameBuffer,
    ProtocolError,
    encode,
    frame_bytes,
)
from memproto.client_side import (
    ClientError,
    ConnectionLost,
    DaemonNotRunning,
    RequestFailed,
    check_server,
    check_server_hello,
    client_hello,
    decode_from_server,
)
from memproto.frames import Error, Frame, Hello, History, ListProcesses, Status, Subscribe

from .messages import FrameArrived, LinkDown, LinkUp

if TYPE_CHECKING:
    from memagent.embedded import EmbeddedAgent

SOFTWARE = "memtop 0.1.0"
STATUS_EVERY = 2.0
BACKOFF_MAX = 5.0


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
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
            raise DaemonNotRunning(self.path) from None
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
    """The app's connection worker: connect (starting an embedded agent when no daemon
    answers and that is allowed), ask for the current state and subscribe, relay every
    frame, and reconnect with backoff when the link drops. It only posts messages
    (:mod:`memtop.messages`); the app sends its requests on :attr:`link`."""

    def __init__(self, path: str, post: Callable[[Message], object], *, allow_embedded: bool = True,
                 demo: bool = False, embedded_interval: float = 0.5) -> None:
        self.path = path
        self.post = post
        self.allow_embedded = allow_embedded
        self.demo = demo
        self.embedded_interval = embedded_interval
        #: The open link; None while disconnected.
        self.link: DaemonLink | None = None
        #: The agent started in-process because no daemon answered; None: none.
        self.embedded: EmbeddedAgent | None = None

    async def run(self) -> None:
        backoff = 0.5
        path = self.path
        embedded = False
        if self.demo:
            path, embedded = await self._start_embedded(), True
        while True:
            link = DaemonLink(path)
            try:
                await link.open()
            except DaemonNotRunning as exc:
                if self.allow_embedded and not embedded and self.embedded is None:
                    path, embedded = await self._start_embedded(), True
                    continue
                # Short enough for the header's status line (the CLI adds how to start one).
                self.post(LinkDown(f"no memagent daemon at {exc.path}", backoff))
            except (OSError, ClientError, ProtocolError, asyncio.TimeoutError) as exc:
                self.post(LinkDown(str(exc) or type(exc).__name__, backoff))
            else:
                backoff = 0.5
                self.link = link
                self.post(LinkUp(path, embedded))
                await self._serve(link)
                self.link = None
                link.close()
                continue
            link.close()
            await asyncio.sleep(backoff)
            backoff = min(BACKOFF_MAX, backoff * 2)

    def stop(self) -> None:
        """Stop the embedded agent, if one was started."""
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None

    async def _start_embedded(self) -> str:
        from memagent.embedded import start_embedded

        agent = await asyncio.to_thread(start_embedded, interval=self.embedded_interval, demo=self.demo)
        self.embedded = agent
        return str(agent.socket)

    async def _serve(self, link: DaemonLink) -> None:
        """Ask for the current state, subscribe, then relay frames until the link drops."""
        for frame in (ListProcesses(link.next_id()), History(link.next_id()), Status(link.next_id()),
                      Subscribe(link.next_id())):
            link.send(frame)
        poller = asyncio.ensure_future(self._poll_status(link))
        try:
            while True:
                self.post(FrameArrived(await link.recv()))
        except (OSError, ConnectionLost, ProtocolError) as exc:
            self.post(LinkDown(str(exc) or type(exc).__name__, 0.5))
        finally:
            poller.cancel()

    async def _poll_status(self, link: DaemonLink) -> None:
        with contextlib.suppress(ConnectionLost, OSError):
            while True:
                await asyncio.sleep(STATUS_EVERY)
                link.send(Status(link.next_id()))
