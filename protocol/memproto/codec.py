"""msgpack encoding and validating decoding of frames.

:func:`decode` never lets a msgpack or lookup error escape: anything wrong becomes a
:class:`ProtocolError` that names the frame and field. An unknown frame type raises
:class:`UnknownFrameType`, which a client may ignore (a newer server may push events it
does not know) and a server answers with an error.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgpack

from . import limits
from .errors import IncompatibleVersion, ProtocolError
from .frames import FRAME_TYPES, Frame
from .records import SAMPLE_COLUMNS, Series
from .schema import from_wire, to_wire
from .version import PROTOCOL_MAJOR, compatible


class UnknownFrameType(ProtocolError):
    code = "unknown_request"

    def __init__(self, type_tag: str) -> None:
        self.type_tag = type_tag
        super().__init__(f"unknown frame type {type_tag!r}", field="t")


def encode(frame: Frame) -> bytes:
    """msgpack bytes of ``frame`` (without the length prefix)."""
    body = to_wire(frame)
    body["t"] = frame.TYPE
    body["v"] = PROTOCOL_MAJOR
    return msgpack.packb(body, use_bin_type=True)  # type: ignore[no-any-return]


def encode_sample(
    seq: int, time: float, interval: float, rows: Sequence[Sequence[Any]], fields: tuple[str, ...] = SAMPLE_COLUMNS
) -> bytes:
    """Fast path for the per-tick frame: rows go to msgpack's C packer untouched.

    ``rows`` (lists or tuples) follow ``fields``: :data:`~memproto.records.SAMPLE_COLUMNS` (what this agent
    sends), or v1.0's :data:`~memproto.records.SAMPLE_FIELDS`.
    """
    body = {
        "t": "sample",
        "v": PROTOCOL_MAJOR,
        "seq": seq,
        "time": time,
        "interval": interval,
        "fields": fields,
        "rows": rows,
    }
    return msgpack.packb(body, use_bin_type=True)  # type: ignore[no-any-return]


def encode_history_ok(request_id: int, step: float, series: Iterable[Series], count: int) -> bytes:
    """A ``history_ok`` frame encoded series by series, so that the agent never holds the
    values of every process as Python objects at once (1000 x 600 ints)."""
    packer = msgpack.Packer(use_bin_type=True, autoreset=False)
    packer.pack_map_header(5)
    for key, value in (("t", "history_ok"), ("v", PROTOCOL_MAJOR), ("id", request_id), ("step", step)):
        packer.pack(key)
        packer.pack(value)
    packer.pack("series")
    packer.pack_array_header(count)
    for s in series:
        packer.pack({"pid": s.pid, "start_time": s.start_time, "end_time": s.end_time, "rss_bytes": s.rss_bytes})
    return packer.bytes()  # type: ignore[no-any-return]


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack ext type {code} is not used by this protocol")


def unpack(payload: bytes) -> Any:
    """msgpack bytes to Python values under the limits of :mod:`memproto.limits`."""
    try:
        return msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            max_str_len=limits.MAX_STR_LEN,
            max_bin_len=limits.MAX_BIN_LEN,
            max_array_len=limits.MAX_ARRAY_LEN,
            max_map_len=limits.MAX_MAP_LEN,
            max_ext_len=0,
            ext_hook=_refuse_ext,
        )
    except msgpack.ExtraData:
        raise ProtocolError("trailing bytes after the msgpack object") from None
    except (ValueError, TypeError, msgpack.UnpackException, UnicodeDecodeError, RecursionError) as exc:
        # msgpack signals limit violations, truncation and bad bytes as ValueError
        # subclasses (FormatError, StackError, OutOfData, BufferFull).
        raise ProtocolError(f"not valid msgpack: {exc.__class__.__name__}: {exc}") from None


def decode(payload: bytes) -> Frame:
    """Validate and build the frame in ``payload``."""
    return decode_body(unpack(payload))


def decode_body(body: Any) -> Frame:
    """Validate and build a frame from an already unpacked msgpack object."""
    if type(body) is not dict:
        raise ProtocolError(f"a frame must be a map, got {type(body).__name__}")
    tag = body.get("t")
    if type(tag) is not str:
        raise ProtocolError("missing or non-string frame type", field="t")
    version = body.get("v")
    if type(version) is not int:
        raise ProtocolError("missing or non-integer protocol version", frame=tag, field="v")
    if not compatible(version):
        raise IncompatibleVersion(version, PROTOCOL_MAJOR)
    cls = FRAME_TYPES.get(tag)
    if cls is None:
        raise UnknownFrameType(tag)
    try:
        frame = from_wire(cls, body)
    except ProtocolError as exc:
        exc.frame = tag
        exc.args = (f"{tag}.{exc.field}: {exc.reason}" if exc.field else f"{tag}: {exc.reason}",)
        raise
    frame.validate()
    return frame
