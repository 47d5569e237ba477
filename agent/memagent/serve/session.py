"""One connected client: its outgoing queue, its writer, and its reader.

The sampler never waits for a client. It hands each subscriber the already-encoded
sample frame; a client's queue holds at most :data:`MAX_QUEUED_SAMPLES` of them and drops
the oldest when full, counting the drops. Before the next sample the client receives a
``dropped`` frame with the running total. Replies and events are never dropped; a client
that lets more than :data:`MAX_QUEUED_OTHER` of them pile up is disconnected.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from memproto import Frame, FrameBuffer, FrameTooLarge, ProtocolError, encode, frame_bytes
from memproto.frames import Dropped, Error

from .access import Access

log = logging.getLogger(__name__)

MAX_QUEUED_SAMPLES = 4
MAX_QUEUED_OTHER = 1024
#: Transport buffer above which ``drain()`` waits; beyond it, samples queue (and drop).
WRITE_HIGH_WATER = 256 * 1024
READ_CHUNK = 65536


class ClientSession:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, access: Access) -> None:
        self.reader = reader
        self.writer = writer
        self.access = access
        self.subscribed = False
        self.greeted = False
        self.dropped = 0
        self._dropped_reported = 0
        self._queue: deque[tuple[bool, bytes]] = deque()
        self._samples = 0
        self._wakeup = asyncio.Event()
        self._closing = False
        writer.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)

    @property
    def name(self) -> str:
        return f"client pid {self.access.peer.pid} uid {self.access.peer.uid}"

    # ------------------------------------------------------------------ sending

    def send(self, frame: Frame | bytes, request_id: int | None = None) -> None:
        """Queue a reply or event (a frame, or an encoded payload); never dropped. A reply
        too large for one frame is replaced by an error that says so."""
        try:
            framed = frame_bytes(frame if isinstance(frame, bytes) else encode(frame))
        except FrameTooLarge as exc:
            request_id = getattr(frame, "id", request_id)
            framed = frame_bytes(encode(Error(request_id, "too_large", f"reply {exc}; ask for less")))
        self.send_event(framed)

    def send_event(self, framed: bytes) -> None:
        """Queue an encoded, framed reply or event; never dropped."""
        if self._closing:
            return
        if len(self._queue) - self._samples >= MAX_QUEUED_OTHER:
            log.warning("%s: %d frames unread, disconnecting", self.name, MAX_QUEUED_OTHER)
            self.abort()
            return
        self._queue.append((False, framed))
        self._wakeup.set()

    def send_sample(self, framed: bytes) -> None:
        """Queue an encoded, framed sample; drop the oldest queued sample when full."""
        if self._closing:
            return
        if self._samples >= MAX_QUEUED_SAMPLES:
            for i, (is_sample, _) in enumerate(self._queue):
                if is_sample:
                    del self._queue[i]
                    break
            self._samples -= 1
            self.dropped += 1
        self._queue.append((True, framed))
        self._samples += 1
        self._wakeup.set()

    def close_with(self, error: Error) -> None:
        """Send a final error frame, then close once it is written."""
        self.send(error)
        self._closing = True
        self._wakeup.set()

    def abort(self) -> None:
        self._closing = True
        self._queue.clear()
        self._samples = 0
        self.writer.transport.abort()
        self._wakeup.set()

    async def write_loop(self) -> None:
        try:
            while True:
                if not self._queue:
                    if self._closing:
                        break
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                is_sample, data = self._queue.popleft()
                if is_sample:
                    self._samples -= 1
                    if self.dropped > self._dropped_reported:
                        self._dropped_reported = self.dropped
                        self.writer.write(frame_bytes(encode(Dropped(self.dropped))))
                self.writer.write(data)
                await self.writer.drain()
        except (ConnectionError, OSError):
            pass  # the client went away; the reader sees EOF and ends the session
        finally:
            self.writer.close()

    # ------------------------------------------------------------------ receiving

    async def read_loop(self, max_frame: int, on_payload: Callable[[bytes], None]) -> None:
        """Feed complete payloads to ``on_payload`` until EOF or a framing error."""
        buffer = FrameBuffer(max_frame)
        try:
            while not self._closing:
                data = await self.reader.read(READ_CHUNK)
                if not data:
                    break
                for payload in buffer.feed(data):
                    on_payload(payload)
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
