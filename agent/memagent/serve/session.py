"""One connected client: what it may have queued, its writer and its reader.

Bounds, so that no client can make the daemon hold much or wait for it
(``docs/security.md``):

- **samples**: the sampler never waits for a client. Each subscriber's queue holds at most
  :data:`MAX_QUEUED_SAMPLES` sample frames and drops the oldest when full, counting the
  drops; before the next sample the client receives a ``dropped`` frame with the total.
- **replies**: a client's requests are served one at a time, and the next one only once
  the previous reply has been written out (:meth:`ClientSession.wait_flushed`): one reply
  at most waits in memory for a client that does not read.
- **requests**: at most :data:`MAX_PENDING_REQUESTS` are read ahead; beyond, the socket is
  not read until one is served, so a client pipelining requests is slowed by the kernel's
  socket buffer, not buffered by us.
- **events** (attached, exited, alerts, ...): a client that leaves more than
  :data:`MAX_EVENT_BACKLOG` bytes of them unread is disconnected.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from memproto import Frame, FrameBuffer, FrameTooLarge, ProtocolError, encode, frame_bytes
from memproto.frames import Dropped, Error
from memproto.vocabulary import ErrorCode

from .access import Access

log = logging.getLogger(__name__)

MAX_QUEUED_SAMPLES = 4
MAX_EVENT_BACKLOG = 1024 * 1024
MAX_PENDING_REQUESTS = 8
#: Transport buffer above which ``drain()`` waits; beyond it, samples queue (and drop).
WRITE_HIGH_WATER = 256 * 1024
READ_CHUNK = 65536


class Kind(enum.Enum):
    SAMPLE = 1
    EVENT = 2
    REPLY = 3


class ClientSession:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, access: Access) -> None:
        self.reader = reader
        self.writer = writer
        self.access = access
        self.subscribed = False
        self.greeted = False
        self.dropped = 0
        #: Requests read and not served yet: (request id, frame).
        self.requests: asyncio.Queue[tuple[int | None, Frame]] = asyncio.Queue(MAX_PENDING_REQUESTS)
        #: Replies that will be sent later (a fresh stack dump), by request id.
        self.deferred = 0
        self._dropped_reported = 0
        self._queue: deque[tuple[Kind, bytes]] = deque()
        self._samples = 0
        self._event_bytes = 0
        self._wakeup = asyncio.Event()
        self._flushed = asyncio.Event()
        self._flushed.set()
        self._closing = False
        writer.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)

    @property
    def name(self) -> str:
        return f"client pid {self.access.peer.pid} uid {self.access.peer.uid}"

    @property
    def closing(self) -> bool:
        return self._closing

    # ------------------------------------------------------------------ sending

    def send(self, frame: Frame | bytes, request_id: int | None = None) -> None:
        """Queue a reply (a frame, or an encoded payload). A reply too large for one frame
        is replaced by an error that says so."""
        try:
            framed = frame_bytes(frame if isinstance(frame, bytes) else encode(frame))
        except FrameTooLarge as exc:
            request_id = getattr(frame, "id", request_id)
            framed = frame_bytes(encode(Error(request_id, ErrorCode.TOO_LARGE, f"reply {exc}; ask for less")))
        self._enqueue(Kind.REPLY, framed)

    def send_event(self, framed: bytes) -> None:
        """Queue an encoded, framed event; a client with too much unread is disconnected."""
        if self._closing:
            return
        if self._event_bytes + len(framed) > MAX_EVENT_BACKLOG:
            log.warning("%s: over %d bytes of events unread, disconnecting", self.name, MAX_EVENT_BACKLOG)
            self.abort()
            return
        self._event_bytes += len(framed)
        self._enqueue(Kind.EVENT, framed)

    def send_sample(self, framed: bytes) -> None:
        """Queue an encoded, framed sample; drop the oldest queued sample when full."""
        if self._closing:
            return
        if self._samples >= MAX_QUEUED_SAMPLES:
            for i, (kind, _) in enumerate(self._queue):
                if kind is Kind.SAMPLE:
                    del self._queue[i]
                    break
            self._samples -= 1
            self.dropped += 1
        self._samples += 1
        self._enqueue(Kind.SAMPLE, framed)

    def _enqueue(self, kind: Kind, framed: bytes) -> None:
        if self._closing:
            return
        self._queue.append((kind, framed))
        self._flushed.clear()
        self._wakeup.set()

    async def wait_flushed(self) -> None:
        """Until everything queued has been handed to the transport (and its buffer is
        below the high-water mark): the next reply may then be built."""
        await self._flushed.wait()

    def close_with(self, error: Error) -> None:
        """Send a final error frame, then close once it is written."""
        self.send(error)
        self._closing = True
        self._wakeup.set()

    def abort(self) -> None:
        self._closing = True
        self._queue.clear()
        self._samples = 0
        self._event_bytes = 0
        self.writer.transport.abort()
        self._wakeup.set()
        self._flushed.set()

    async def write_loop(self) -> None:
        try:
            while True:
                if not self._queue:
                    self._flushed.set()
                    if self._closing:
                        break
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                kind, data = self._queue.popleft()
                if kind is Kind.SAMPLE:
                    self._samples -= 1
                    if self.dropped > self._dropped_reported:
                        self._dropped_reported = self.dropped
                        self.writer.write(frame_bytes(encode(Dropped(self.dropped))))
                elif kind is Kind.EVENT:
                    self._event_bytes -= len(data)
                self.writer.write(data)
                await self.writer.drain()
        except (ConnectionError, OSError):
            pass  # the client went away; the reader sees EOF and ends the session
        finally:
            self._flushed.set()
            self.writer.close()

    # ------------------------------------------------------------------ receiving

    async def read_loop(self, max_frame: int, on_payload: Callable[[bytes], Awaitable[None]]) -> None:
        """Feed complete payloads to ``on_payload`` until EOF or a framing error; it may
        wait (a full request queue), and the socket is not read meanwhile."""
        buffer = FrameBuffer(max_frame)
        try:
            while not self._closing:
                data = await self.reader.read(READ_CHUNK)
                if not data:
                    break
                for payload in buffer.feed(data):
                    await on_payload(payload)
                    if self._closing:
                        break
        except ProtocolError as exc:  # only framing errors reach here
            log.info("%s: %s", self.name, exc)
            self.close_with(Error(None, exc.code, str(exc)))
        except (ConnectionError, OSError):
            pass
        finally:
            if not self._closing:
                self._closing = True
                self._wakeup.set()
