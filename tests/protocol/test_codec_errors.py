"""Decoding refuses malformed frames with a ProtocolError that names the field (part of the codec tests)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from codec_examples import EXAMPLES, decode_error, info_map, packed

from memproto import PROTOCOL_MAJOR, IncompatibleVersion, ProtocolError, UnknownFrameType, decode, decode_body, encode
from memproto.frames import Ack, Error, Exited
from memproto.schema import to_wire

# --------------------------------------------------------------------------- errors name the field



@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (packed("attach", id=1, pids=[1, True]), "attach.pids[1]: expected int, got bool"),
        (packed("list"), "list.id: missing required field"),
        (packed("bogus", id=5), "t: unknown frame type 'bogus'"),
    ],
)
def test_messages_as_documented(payload: bytes, message: str) -> None:
    """The server sends these messages to clients; docs/protocol.md §5.5 quotes them."""
    assert str(decode_error(payload)) == message


def test_missing_field_is_named() -> None:
    """A request without its id must say so, not raise KeyError."""
    err = decode_error(packed("attach", pids=[1]))
    assert "attach.id" in str(err)
    assert (err.frame, err.field) == ("attach", "id")
    assert "missing" in err.reason


def test_wrong_type_in_list_names_the_index() -> None:
    """The peer learns which element of a list was wrong."""
    err = decode_error(packed("attach", id=1, pids=[1, "2", 3]))
    assert "attach.pids[1]" in str(err)
    assert err.field == "pids[1]"
    assert "str" in str(err)


def test_nested_wrong_type_names_the_path() -> None:
    """Errors deep inside nested maps carry the full path."""
    err = decode_error(packed("list_ok", id=4, processes=[info_map(rss_bytes="512M")]))
    assert "list_ok.processes[0].rss_bytes" in str(err)
    assert err.field == "processes[0].rss_bytes"


def test_nested_missing_field_names_the_path() -> None:
    """A nested map missing a field is reported with its path."""
    status = to_wire(EXAMPLES["status_ok"])["status"]
    del status["tick"]["overruns"]
    err = decode_error(packed("status_ok", id=8, status=status))
    assert "status_ok.status.tick.overruns" in str(err)


def test_nested_part_must_be_a_map() -> None:
    """A nested part sent as a list is refused, not indexed."""
    err = decode_error(packed("attached", process=[4242, 1.0]))
    assert "attached.process" in str(err)
    assert "map" in str(err)


def test_list_field_must_be_a_list() -> None:
    """A scalar where a list is expected is refused."""
    err = decode_error(packed("attach", id=1, pids=4242))
    assert "attach.pids" in str(err)
    assert "array" in str(err)


@pytest.mark.parametrize(
    ("tag", "fields", "path"),
    [
        ("attach", {"id": True, "pids": [1]}, "attach.id"),
        ("attach", {"id": 1, "pids": [1, False]}, "attach.pids[1]"),
        ("dropped", {"count": True}, "dropped.count"),
    ],
)
def test_bool_is_not_an_int(tag: str, fields: dict[str, Any], path: str) -> None:
    """msgpack true is not 1: a peer sending a bool for a PID is confused."""
    err = decode_error(packed(tag, **fields))
    assert path in str(err)
    assert "bool" in str(err)


def test_bool_is_not_a_float() -> None:
    """A float field refuses a bool too."""
    err = decode_error(packed("exited", pid=1, start_time=True, time=1.0, rss_peak_bytes=0))
    assert "exited.start_time" in str(err)


def test_int_is_accepted_for_a_float_field() -> None:
    """Peers may encode whole seconds as ints; the frame holds floats."""
    frame = decode(packed("exited", pid=4243, start_time=1_700_000_513, time=1_700_000_900, rss_peak_bytes=0))
    assert isinstance(frame, Exited)
    assert type(frame.start_time) is float
    assert type(frame.time) is float
    assert frame.start_time == 1_700_000_513.0


def test_float_is_not_an_int() -> None:
    """A byte count of 1.5 is nonsense, not something to round."""
    err = decode_error(packed("dropped", count=1.5))
    assert "dropped.count" in str(err)


def test_nil_only_where_optional() -> None:
    """nil is accepted for optional fields and refused for required ones."""
    assert decode(packed("error", id=None, code="protocol", message="bye")) == Error(None, "protocol", "bye")
    err = decode_error(packed("ack", id=None))
    assert "ack.id" in str(err)
    assert "nil" in str(err)


@pytest.mark.parametrize("tag_value", [5, None, b"attach", ["attach"]])
def test_frame_type_must_be_a_string(tag_value: Any) -> None:
    """A non-string type tag is refused before any lookup."""
    payload = msgpack.packb({"t": tag_value, "v": PROTOCOL_MAJOR, "id": 1}, use_bin_type=True)
    err = decode_error(payload)
    assert err.field == "t"
    assert not isinstance(err, UnknownFrameType)


def test_missing_type_is_refused() -> None:
    """A map without ``t`` is not a frame."""
    err = decode_error(msgpack.packb({"v": PROTOCOL_MAJOR, "id": 1}))
    assert err.field == "t"


@pytest.mark.parametrize("version", ["missing", "1", 1.0, True, None])
def test_version_must_be_an_int(version: Any) -> None:
    """``v`` is required and must be an integer."""
    raw: dict[str, Any] = {"t": "ack", "id": 1}
    if version != "missing":
        raw["v"] = version
    err = decode_error(msgpack.packb(raw))
    assert err.field == "v"
    assert not isinstance(err, IncompatibleVersion)


@pytest.mark.parametrize("major", [0, PROTOCOL_MAJOR + 1, 99])
def test_incompatible_major_version(major: int) -> None:
    """Another major version is refused with a dedicated error carrying both versions."""
    with pytest.raises(IncompatibleVersion) as info:
        decode(msgpack.packb({"t": "ack", "v": major, "id": 1}))
    assert (info.value.theirs, info.value.ours) == (major, PROTOCOL_MAJOR)
    assert info.value.code == "version"


def test_incompatible_version_wins_over_unknown_type() -> None:
    """A v2 peer's new frame types are reported as a version mismatch, the real cause."""
    with pytest.raises(IncompatibleVersion):
        decode(msgpack.packb({"t": "frobnicate", "v": PROTOCOL_MAJOR + 1}))


def test_unknown_frame_type() -> None:
    """Unknown types raise a distinct error a client may choose to ignore."""
    with pytest.raises(UnknownFrameType) as info:
        decode(packed("frobnicate", id=1))
    assert info.value.type_tag == "frobnicate"
    assert info.value.code == "unknown_request"
    assert isinstance(info.value, ProtocolError)
    assert "frobnicate" in str(info.value)


@pytest.mark.parametrize("value", [[1, 2], "attach", 42, None, b"\x00"])
def test_payload_must_be_a_map(value: Any) -> None:
    """A well-formed msgpack value that is not a map is not a frame."""
    err = decode_error(msgpack.packb(value, use_bin_type=True))
    assert "map" in str(err)


def test_decode_body_refuses_non_dict() -> None:
    """decode_body is the entry point for already unpacked values and checks them too."""
    with pytest.raises(ProtocolError, match="map"):
        decode_body([("t", "ack")])


@pytest.mark.parametrize(
    "payload",
    [
        b"",  # nothing at all
        b"\xc1",  # a byte msgpack never uses
        b"\x92\x01",  # an array of 2 with one element: truncated
        b"\x81\xa1t",  # a map whose value is missing
        b"\xdb\x00\x00\x00\x05ab",  # a str32 announcing 5 bytes, carrying 2
        b"GET / HTTP/1.1\r\n\r\n",  # someone pointed a browser at the socket
    ],
)
def test_garbage_is_a_protocol_error(payload: bytes) -> None:
    """Bytes that are not msgpack never leak a msgpack exception."""
    with pytest.raises(ProtocolError):
        decode(payload)


def test_invalid_utf8_is_a_protocol_error() -> None:
    """A str with invalid UTF-8 is refused, not decoded with replacement characters."""
    with pytest.raises(ProtocolError):
        decode(b"\x82\xa1t\xa3a\xffk\xa1v\x01")


@pytest.mark.parametrize("key", [1, None, 1.5, True, (1, 2)], ids=["int", "nil", "float", "bool", "array"])
def test_non_string_map_keys_are_refused(key: Any) -> None:
    """Non-str keys could never name a field; the decoder refuses them (docs §3.3)."""
    with pytest.raises(ProtocolError):
        decode(msgpack.packb({"t": "ack", "v": 1, "id": 1, key: 2}, use_bin_type=True))


def test_bin_map_keys_are_ignored_like_unknown_keys() -> None:
    """docs §3.3: a bin key never names a field, so it is ignored; it cannot stand in for one."""
    assert decode(msgpack.packb({"t": "ack", "v": 1, "id": 1, b"extra": 2}, use_bin_type=True)) == Ack(id=1)
    with pytest.raises(ProtocolError, match=r"ack\.id"):
        decode(msgpack.packb({"t": "ack", "v": 1, b"id": 1}, use_bin_type=True))


def test_trailing_bytes_are_refused() -> None:
    """Extra bytes after the object mean the framing is out of sync."""
    payload = encode(Ack(id=1))
    assert decode(payload) == Ack(id=1)
    with pytest.raises(ProtocolError, match="trailing"):
        decode(payload + b"\x00")
    with pytest.raises(ProtocolError, match="trailing"):
        decode(payload + payload)


def test_hello_validates_version_and_role() -> None:
    """Hello's cross-field checks run after decoding."""
    err = decode_error(packed("hello", version=[1], role="client", software="x"))
    assert (err.frame, err.field) == ("hello", "version")
    err = decode_error(packed("hello", version=[1, 0], role="admin", software="x"))
    assert (err.frame, err.field) == ("hello", "role")
