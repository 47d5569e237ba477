"""Stream framing: a 4-byte big-endian length, then that many bytes of msgpack.

Sans-I/O: :class:`FrameBuffer` is fed whatever bytes a socket produced and returns the
complete payloads; it never reads or blocks, so the asyncio server and the blocking
command-line client share it.
"""

from __future__ import annotations

import struct

from .errors import FrameTooLarge
from .limits import HEADER_BYTES, MAX_FRAME_BYTES

_HEADER = struct.Struct(">I")


def frame_bytes(payload: bytes) -> bytes:
    """Prefix ``payload`` with its length, ready to write to the stream."""
    if len(payload) > MAX_FRAME_BYTES:
        raise FrameTooLarge(len(payload), MAX_FRAME_BYTES)
    return _HEADER.pack(len(payload)) + payload


class FrameBuffer:
    """Accumulates stream bytes and splits them into payloads.

    A length prefix above ``max_frame`` raises :class:`FrameTooLarge` at once, before
    any of the announced bytes are buffered. After an error the stream is out of sync
    and the connection must be closed.
    """

    def __init__(self, max_frame: int = MAX_FRAME_BYTES) -> None:
        self._max = max_frame
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        while len(self._buf) >= HEADER_BYTES:
            (size,) = _HEADER.unpack_from(self._buf)
            if size > self._max:
                raise FrameTooLarge(size, self._max)
            end = HEADER_BYTES + size
            if len(self._buf) < end:
                break
            out.append(bytes(self._buf[HEADER_BYTES:end]))
            del self._buf[:end]
        return out

    @property
    def pending(self) -> int:
        """Bytes received that do not yet form a complete frame."""
        return len(self._buf)
