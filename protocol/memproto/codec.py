"""msgpack encoding and validating decoding of frames.

:func:`decode` never lets a msgpack or lookup error escape: anything wrong becomes a
:class:`ProtocolError` that names the frame and field. An unknown frame type raises
:class:`UnknownFrameType`, which a client may ignore (a newer server may push events it
does not know) and a server answers with an error.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import msgpack

from . import limits
from .errors import IncompatibleVersion, ProtocolError
from .frames import FRAME_TYPES, Frame
from .schema import from_wire, to_wire
from .version import PROTOCOL_MAJOR, compatible

if TYPE_CHECKING:
    from .records.history import Series


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
    seq: int, time: float, interval: float, rows: Sequence[Sequence[Any]], fields: tuple[str, ...] | None = None
) -> bytes:
    """Fast path for the per-tick frame: rows go to msgpack's C packer untouched.

    ``rows`` (lists or tuples) follow ``fields``: :data:`~memproto.records.SAMPLE_COLUMNS` (what this agent
    sends, the default), or v1.0's :data:`~memproto.records.SAMPLE_FIELDS`.
    """
    if fields is None:
        from .records.sample import SAMPLE_COLUMNS as fields  # the sample row's module: loaded where samples are
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


class ListFrameEncoder:
    """A frame whose last field is one long list, packed item by item: the agent never
    holds the whole list as plain Python values at once (1000 x 600 ints of a history),
    and it can stop between items to let its tick run (see ``memagent.core.pacing``).

    ``fixed`` are the frame's other fields (wire values or records); ``count`` items
    must then be :meth:`add`-ed: records (dataclasses) or already plain maps.
    """

    def __init__(self, tag: str, fixed: dict[str, Any], field: str, count: int) -> None:
        self._packer = msgpack.Packer(use_bin_type=True, autoreset=False)
        self._left = count
        self._packer.pack_map_header(len(fixed) + 3)
        for key, value in (("t", tag), ("v", PROTOCOL_MAJOR), *fixed.items()):
            self._packer.pack(key)
            self._packer.pack(to_wire(value))
        self._packer.pack(field)
        self._packer.pack_array_header(count)

    def add(self, item: Any) -> None:
        if self._left <= 0:
            raise ValueError("more items than announced")
        self._left -= 1
        self._packer.pack(to_wire(item))

    @property
    def size(self) -> int:
        """Bytes packed so far (to stop before a frame grows past the limit)."""
        return len(self._packer.getbuffer())

    def bytes(self) -> bytes:
        if self._left:
            raise ValueError(f"{self._left} items announced but not added")
        return self._packer.bytes()  # type: ignore[no-any-return]


def encode_history_ok(request_id: int, step: float, series: Iterable[Series], count: int) -> bytes:
    """A ``history_ok`` frame encoded series by series (:class:`ListFrameEncoder`)."""
    encoder = ListFrameEncoder("history_ok", {"id": request_id, "step": step}, "series", count)
    for s in series:
        encoder.add({"pid": s.pid, "start_time": s.start_time, "end_time": s.end_time, "rss_bytes": s.rss_bytes})
    return encoder.bytes()


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack ext type {code} is not used by this protocol")


def unpack(payload: bytes, *, request: bool = False) -> Any:
    """msgpack bytes to Python values under the limits of :mod:`memproto.limits`; with
    ``request`` (a server reading a client), under the far smaller request limits."""
    try:
        return msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            max_str_len=limits.MAX_REQUEST_STR_LEN if request else limits.MAX_STR_LEN,
            max_bin_len=0 if request else limits.MAX_BIN_LEN,
            max_array_len=limits.MAX_REQUEST_PIDS if request else limits.MAX_ARRAY_LEN,
            max_map_len=limits.MAX_REQUEST_MAP_LEN if request else limits.MAX_MAP_LEN,
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
