"""msgpack limits: bounded maps, strings, arrays, no ext types, no deep nesting (part of the codec tests)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from codec_examples import packed

from memproto import ProtocolError, decode, limits
from memproto.frames import Ack, Error

# --------------------------------------------------------------------------- msgpack limits


def test_map_at_the_key_limit_is_accepted() -> None:
    """The bound is inclusive: MAX_MAP_LEN keys still decode."""
    extra = {f"x{i}": i for i in range(limits.MAX_MAP_LEN - 3)}
    assert decode(packed("ack", id=1, **extra)) == Ack(id=1)


def test_map_with_too_many_keys() -> None:
    """A map beyond MAX_MAP_LEN keys is refused before it is built."""
    extra = {f"x{i}": i for i in range(limits.MAX_MAP_LEN - 2)}
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        decode(packed("ack", id=1, **extra))


def test_string_at_the_length_limit_is_accepted() -> None:
    """The bound is inclusive: a string of MAX_STR_LEN bytes still decodes."""
    message = "m" * limits.MAX_STR_LEN
    frame = decode(packed("error", id=1, code="protocol", message=message))
    assert isinstance(frame, Error)
    assert frame.message == message


def test_string_too_long() -> None:
    """A string longer than MAX_STR_LEN is refused."""
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        decode(packed("error", id=1, code="protocol", message="m" * (limits.MAX_STR_LEN + 1)))


def test_binary_too_long() -> None:
    """A bin blob longer than MAX_BIN_LEN is refused even in an ignored key."""
    with pytest.raises(ProtocolError):
        decode(packed("ack", id=1, blob=b"\x00" * (limits.MAX_BIN_LEN + 1)))


def test_array_too_long() -> None:
    """An array beyond MAX_ARRAY_LEN is refused (a header alone may announce a billion)."""
    with pytest.raises(ProtocolError):
        decode(packed("attach", id=1, pids=[0] * (limits.MAX_ARRAY_LEN + 1)))
    # An array32 header announcing 2**32-1 elements with no elements behind it.
    with pytest.raises(ProtocolError):
        decode(b"\xdd\xff\xff\xff\xff")


@pytest.mark.parametrize(
    "ext",
    [msgpack.ExtType(5, b"abc"), msgpack.ExtType(5, b""), msgpack.Timestamp(1_700_000_000, 0)],
    ids=["ext", "empty-ext", "timestamp"],
)
def test_ext_types_are_refused(ext: Any) -> None:
    """msgpack extension types (the timestamp too) have no meaning in this protocol."""
    with pytest.raises(ProtocolError):
        decode(packed("ack", id=1, when=ext))


def test_pathological_nesting_is_a_protocol_error() -> None:
    """Very deep nesting ends as a ProtocolError, never a RecursionError or a crash."""
    with pytest.raises(ProtocolError):
        decode(b"\x91" * 100_000 + b"\x00")
