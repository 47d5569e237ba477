"""The connection to the daemon: asyncio streams + memproto. Used only by the app's
connection worker; widgets never see it.
"""

from __future__ import annotations

import asyncio
import itertools

from memproto import (
    FrameBuffer,
    encode,
    frame_bytes,
)
from memproto.client_side import check_server_hello, client_hello, decode_from_server
from memproto.frames import Error, Frame, Hello

SOFTWARE = "memtop 0.1.0"


class NoDaemon(Exception):
    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"no memagent daemon at {path}")


class LinkClosed(Exception):
    pass


class DaemonLink:
    def __init__(self, path: str) -> None:
        self.path = path
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._buffer = FrameBuffer()
        self._pending: list[Frame] = []
        self._ids = itertools.count(1)
        self.hello: Hello | None = None

    async def open(self, timeout: float = 5.0) -> Hello:
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_unix_connection(self.path), timeout
            )
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
            raise NoDaemon(self.path) from None
        self.send(client_hello(SOFTWARE))
        first = await asyncio.wait_for(self.recv(), timeout)
        if isinstance(first, Error):
            raise LinkClosed(first.message)
        self.hello = check_server_hello(first)
        return self.hello

    def next_id(self) -> int:
        return next(self._ids)

    def send(self, frame: Frame) -> None:
        if self._writer is None or self._writer.is_closing():
            raise LinkClosed("not connected")
        self._writer.write(frame_bytes(encode(frame)))

    async def recv(self) -> Frame:
        assert self._reader is not None
        while not self._pending:
            data = await self._reader.read(262144)
            if not data:
                raise LinkClosed("the daemon closed the connection")
            self._pending.extend(decode_from_server(self._buffer.feed(data)))
        return self._pending.pop(0)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
