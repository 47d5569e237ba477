"""memproto: the wire protocol between the memagent daemon and its clients.

Frames are msgpack maps (``t``: type tag, ``v``: protocol major version) behind a 4-byte
big-endian length prefix. This package is pure: encoding, decoding, validation and
framing, no sockets and no policy. See ``docs/protocol.md``.
"""

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
from .frames import *  # noqa: F403
from .frames import FRAME_TYPES, Frame
from .framing import FrameBuffer, frame_bytes
from .records import *  # noqa: F403
from .records import SAMPLE_COLUMNS, SAMPLE_FIELDS
from .version import PROTOCOL_MAJOR, PROTOCOL_MINOR, PROTOCOL_VERSION, compatible

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
