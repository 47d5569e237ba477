"""memproto: the wire protocol between the memagent daemon and its clients.

Frames are msgpack maps (``t``: type tag, ``v``: protocol major version) behind a 4-byte
big-endian length prefix. This package is pure: encoding, decoding, validation and
framing, no sockets and no policy. See ``docs/protocol.md``.

The frames' and records' classes are served from here too (``memproto.Sample``), each
module of them imported at its first use (see :mod:`memproto._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import frames as _frames
from ._lazy import lazy_names
from .codec import (
    ListFrameEncoder,
    UnknownFrameType,
    decode,
    decode_body,
    encode,
    encode_history_ok,
    encode_sample,
    unpack,
)
from .errors import FrameTooLarge, IncompatibleVersion, ProtocolError
from .frames import FRAME_TYPES
from .framing import FrameBuffer, frame_bytes
from .version import PROTOCOL_MAJOR, PROTOCOL_MINOR, PROTOCOL_VERSION, compatible

if TYPE_CHECKING:
    from .frames import *  # noqa: F403
    from .frames import Frame as Frame
    from .records import *  # noqa: F403
    from .records import SAMPLE_COLUMNS as SAMPLE_COLUMNS
    from .records import SAMPLE_FIELDS as SAMPLE_FIELDS

__getattr__, __dir__ = lazy_names(__name__, _frames._HOMES)

__all__ = [
    "FRAME_TYPES",
    "PROTOCOL_MAJOR",
    "PROTOCOL_MINOR",
    "PROTOCOL_VERSION",
    "SAMPLE_COLUMNS",
    "SAMPLE_FIELDS",
    "Frame",
    "FrameBuffer",
    "FrameTooLarge",
    "IncompatibleVersion",
    "ListFrameEncoder",
    "ProtocolError",
    "UnknownFrameType",
    "compatible",
    "decode",
    "decode_body",
    "encode",
    "encode_history_ok",
    "encode_sample",
    "frame_bytes",
    "unpack",
]
