"""Encoding and validating decoding of memproto frames.

The codec is the daemon's first line of defence against a confused or hostile peer:
every malformed input must become a :class:`ProtocolError` that names the field, never a
``KeyError`` or a crash, and every frame the daemon sends must come back unchanged.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from memproto import (
    FRAME_TYPES,
    PROTOCOL_MAJOR,
    SAMPLE_COLUMNS,
    SAMPLE_FIELDS,
    Frame,
    IncompatibleVersion,
    ProtocolError,
    UnknownFrameType,
    decode,
    decode_body,
    encode,
    encode_sample,
    frame_bytes,
    limits,
    unpack,
)
from memproto.frames import (
    Ack,
    AlertRaised,
    Attach,
    Attached,
    AttachOk,
    Detach,
    Detached,
    DetachOk,
    Dropped,
    Error,
    Exited,
    Hello,
    History,
    HistoryOk,
    ListOk,
    ListProcesses,
    ResetPeaks,
    ResetPeaksOk,
    Sample,
    Stack,
    StackOk,
    StackStateChanged,
    Status,
    StatusOk,
    Subscribe,
    Unsubscribe,
)
from memproto.records import (
    Alert,
    Contributor,
    DaemonStatus,
    Failure,
    GrowthSite,
    HostMemory,
    ProcessInfo,
    ProcessRef,
    ProcessSample,
    Series,
    StackDump,
    StackFrame,
    ThreadStack,
    TickStats,
)
from memproto.schema import to_wire

MiB = 1024 * 1024
GiB = 1024 * MiB

TRAINER = ProcessInfo(
    pid=4242,
    start_time=1_700_000_512.37,
    name="python3",
    cmdline=["python3", "-m", "train", "--epochs=3", "--note=ünïcode ✓"],
    label="run-17",
    uid=1000,
    alive=True,
    attached_at=1_700_000_600.0,
    exited_at=None,
    rss_bytes=512 * MiB,
    rss_peak_bytes=793 * MiB,
    anon_bytes=473 * MiB,
    swap_bytes=2 * MiB,
    rss_peak_exact=True,
    peak_since=1_700_000_512.37,
)
FINISHED = ProcessInfo(
    pid=4243,
    start_time=1_700_000_513.0,
    name="worker",
    cmdline=[],
    label=None,
    uid=1000,
    alive=False,
    attached_at=1_700_000_600.0,
    exited_at=1_700_000_900.25,
    rss_bytes=0,
    rss_peak_bytes=12 * MiB,
    anon_bytes=0,
    swap_bytes=0,
    rss_peak_exact=False,
    peak_since=1_700_000_700.5,
)
DENIED = Failure(pid=1, code="permission_denied", message="permission denied: 1")
GONE = Failure(pid=99999, code="no_such_process", message="no such process: 99999")
SAMPLE_ROWS: list[list[Any]] = [
    [4242, 1_700_000_512.37, True, 512 * MiB, 793 * MiB, 473 * MiB, 2 * MiB],
    [4243, 1_700_000_513.0, False, 0, 12 * MiB, 0, 0],
]

#: One realistic instance of every frame type, by wire tag.
EXAMPLES: dict[str, Frame] = {
    "hello": Hello(version=[1, 0], role="server", software="memagent 0.1.0", interval=1.0, pid=812),
    "attach": Attach(id=1, pids=[4242, 4243], label="run-17", children=True),
    "detach": Detach(id=2, pids=[4242], exited=True),
    "reset_peaks": ResetPeaks(id=3, pids=[4242, 4243]),
    "list": ListProcesses(id=4),
    "subscribe": Subscribe(id=5),
    "unsubscribe": Unsubscribe(id=6),
    "history": History(id=7, pids=[4242], seconds=120.0),
    "status": Status(id=8),
    "attach_ok": AttachOk(id=1, attached=[TRAINER, FINISHED], failed=[DENIED, GONE]),
    "detach_ok": DetachOk(
        id=2, detached=[ProcessRef(pid=4242, start_time=1_700_000_512.37)], failed=[GONE]
    ),
    "reset_peaks_ok": ResetPeaksOk(id=3, reset=[TRAINER], failed=[DENIED]),
    "list_ok": ListOk(id=4, processes=[TRAINER, FINISHED]),
    "history_ok": HistoryOk(
        id=7,
        step=1.0,
        series=[
            Series(pid=4242, start_time=1_700_000_512.37, end_time=1_700_000_960.0,
                   rss_bytes=[500 * MiB, 793 * MiB, 512 * MiB]),
            Series(pid=4243, start_time=1_700_000_513.0, end_time=1_700_000_901.0, rss_bytes=[]),
        ],
    ),
    "status_ok": StatusOk(
        id=8,
        status=DaemonStatus(
            software="memagent 0.1.0",
            pid=812,
            uid=0,
            started_at=1_700_000_000.5,
            interval=1.0,
            socket="/run/memagent/memagent.sock",
            watched=2,
            alive=1,
            clients=3,
            tick=TickStats(ticks=960, mean_interval=1.0002, max_lateness=0.013, overruns=1,
                           last_duration=0.0007),
            host=HostMemory(total_bytes=32 * 1024 * MiB, available_bytes=24 * 1024 * MiB,
                            swap_total_bytes=8 * 1024 * MiB, swap_free_bytes=7 * 1024 * MiB),
            dropped_samples=41,
        ),
    ),
    "ack": Ack(id=5),
    "error": Error(id=None, code="protocol", message="attach.pids[1]: expected int, got str"),
    "sample": Sample(seq=960, time=1_700_000_960.0, interval=1.0, fields=list(SAMPLE_FIELDS),
                     rows=SAMPLE_ROWS),
    "attached": Attached(process=TRAINER),
    "exited": Exited(pid=4243, start_time=1_700_000_513.0, time=1_700_000_900.25,
                     rss_peak_bytes=12 * MiB),
    "detached": Detached(pid=4242, start_time=1_700_000_512.37),
    "dropped": Dropped(count=17),
    "stack": Stack(id=12, pid=4242, fresh=False),
    "alert": AlertRaised(Alert(
        id=3, kind="headroom", state="firing", severity="critical", resource="host", value=1.53, threshold=1.0,
        message="Σ peaks 460 MiB would use 153% of the 300 MiB headroom of host memory", time=1_700_000_961.0,
        contributors=[Contributor(4242, "bert", 160 * MiB)], unit="ratio",
    )),
    "stack_ok": StackOk(
        id=12, pid=4242, start_time=1_700_000_512.37, state="ok", message=None,
        latest=StackDump(
            time=1_700_000_960.5, trigger="peak", rss_bytes=793 * MiB, vram_bytes=None,
            threads=[
                ThreadStack(thread_id=140001, name="MainThread", active=True, owns_gil=True,
                            frames=[StackFrame("hold_memory", "/srv/model.py", 12),
                                    StackFrame("<module>", "/srv/model.py", 30)]),
                ThreadStack(thread_id=140002, name="<b>[worker]</b>", active=False, owns_gil=False, frames=[]),
            ],
            attributed_thread=140001,
        ),
        at_peak=None,
        by_line=[GrowthSite("hold_memory", "/srv/model.py", 12, 700 * MiB, 3)],
        by_function=[GrowthSite("hold_memory", "/srv/model.py", None, 700 * MiB, 3)],
    ),
    "stack_state": StackStateChanged(pid=4242, start_time=1_700_000_512.37, state="permission_denied",
                                     message="permission denied: run the daemon as root or with CAP_SYS_PTRACE"),
}


def body(tag: str, **fields: Any) -> dict[str, Any]:
    """A raw frame map as a peer would send it."""
    return {"t": tag, "v": PROTOCOL_MAJOR, **fields}


def packed(tag: str, **fields: Any) -> bytes:
    """msgpack bytes of a raw frame map, bypassing the encoder's typing."""
    return msgpack.packb(body(tag, **fields), use_bin_type=True)  # type: ignore[no-any-return]


def info_map(**changes: Any) -> dict[str, Any]:
    """The wire map of TRAINER, with some fields replaced."""
    data = to_wire(TRAINER)
    data.update(changes)
    return data  # type: ignore[no-any-return]


def sample_payload(fields: list[str], rows: list[list[Any]]) -> bytes:
    """A sample frame with hand-picked columns, as a newer or a broken agent might send."""
    return packed("sample", seq=1, time=1_700_000_960.0, interval=1.0, fields=fields, rows=rows)


# --------------------------------------------------------------------------- round trips


def test_examples_cover_every_frame_type() -> None:
    """A frame type added without an example here would escape the round-trip test."""
    assert set(EXAMPLES) == set(FRAME_TYPES)
    for tag, frame in EXAMPLES.items():
        assert type(frame) is FRAME_TYPES[tag]


@pytest.mark.parametrize("tag", sorted(EXAMPLES))
def test_round_trip(tag: str) -> None:
    """What the daemon encodes, a client decodes to an equal frame of the same class."""
    frame = EXAMPLES[tag]
    decoded = decode(encode(frame))
    assert type(decoded) is type(frame)
    assert decoded == frame


@pytest.mark.parametrize("tag", sorted(EXAMPLES))
def test_encode_tags_type_and_version(tag: str) -> None:
    """Every encoded frame carries the ``t`` and ``v`` keys a peer dispatches on."""
    raw = unpack(encode(EXAMPLES[tag]))
    assert raw["t"] == tag
    assert raw["v"] == PROTOCOL_MAJOR


def test_round_trip_keeps_nested_types() -> None:
    """Nested parts come back as their dataclasses, not as plain maps."""
    reply = decode(encode(EXAMPLES["status_ok"]))
    assert isinstance(reply, StatusOk)
    assert isinstance(reply.status.tick, TickStats)
    assert isinstance(reply.status.host, HostMemory)
    listing = decode(encode(EXAMPLES["attach_ok"]))
    assert isinstance(listing, AttachOk)
    assert all(isinstance(p, ProcessInfo) for p in listing.attached)
    assert all(isinstance(f, Failure) for f in listing.failed)
    assert listing.attached[0].cmdline[-1] == "--note=ünïcode ✓"


def test_encode_sample_decodes_to_records() -> None:
    """The per-tick fast path must produce frames the validating decoder accepts; a v1.0
    frame (no GPU columns) decodes with the v1.1 columns nil."""
    frame = decode(encode_sample(960, 1_700_000_960.0, 1.0, SAMPLE_ROWS, SAMPLE_FIELDS))
    assert isinstance(frame, Sample)
    assert frame.fields == list(SAMPLE_FIELDS)
    assert (frame.seq, frame.time, frame.interval) == (960, 1_700_000_960.0, 1.0)
    assert frame.records() == [
        ProcessSample(4242, 1_700_000_512.37, True, 512 * MiB, 793 * MiB, 473 * MiB, 2 * MiB),
        ProcessSample(4243, 1_700_000_513.0, False, 0, 12 * MiB, 0, 0),
    ]
    assert frame == EXAMPLES["sample"]


def test_encode_sample_with_no_rows() -> None:
    """A tick with nothing watched is still a valid frame."""
    frame = decode(encode_sample(1, 1_700_000_001.0, 1.0, []))
    assert isinstance(frame, Sample)
    assert frame.records() == []


def test_sample_records_accept_integer_start_time() -> None:
    """A start time sent as an int is still a float in the record."""
    row = [4242, 1_700_000_512, True, 1, 2, 3, 4]
    frame = decode(sample_payload(list(SAMPLE_FIELDS), [row]))
    assert isinstance(frame, Sample)
    (record,) = frame.records()
    assert type(record.start_time) is float
    assert record.start_time == 1_700_000_512.0


def test_encoding_matches_the_documented_bytes() -> None:
    """docs/protocol.md §13.5 gives the exact bytes of a list request; other clients rely on them."""
    expected = bytes.fromhex("0000000f83a2696401a174a46c697374a17601")
    assert frame_bytes(encode(ListProcesses(id=1))) == expected
    assert decode(expected[4:]) == ListProcesses(id=1)


def test_defaults_fill_absent_optional_fields() -> None:
    """An older client may omit optional fields; the decoder fills in the defaults."""
    assert decode(packed("attach", id=1, pids=[7])) == Attach(id=1, pids=[7], label=None, children=False)
    assert decode(packed("history", id=2)) == History(id=2, pids=[], seconds=None)
    assert decode(packed("hello", version=[1, 0], role="client", software="memagent-cli")) == Hello(
        version=[1, 0], role="client", software="memagent-cli"
    )


def test_fields_added_in_later_minors_default_when_absent() -> None:
    """An older server omits optional fields; the documented defaults apply."""
    info = info_map()
    del info["rss_peak_exact"], info["peak_since"]
    frame = decode(packed("attached", process=info))
    assert isinstance(frame, Attached)
    assert (frame.process.rss_peak_exact, frame.process.peak_since) == (True, 0.0)
    status = to_wire(EXAMPLES["status_ok"])["status"]
    del status["dropped_samples"]
    reply = decode(packed("status_ok", id=8, status=status))
    assert isinstance(reply, StatusOk)
    assert reply.status.dropped_samples == 0


# --------------------------------------------------------------------------- errors name the field


def decode_error(payload: bytes) -> ProtocolError:
    """The ProtocolError that decoding ``payload`` raises."""
    with pytest.raises(ProtocolError) as info:
        decode(payload)
    return info.value


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


# --------------------------------------------------------------------------- sample frames


def test_sample_row_of_wrong_width() -> None:
    """A row shorter than the header would misalign every column after it."""
    rows = [SAMPLE_ROWS[0], SAMPLE_ROWS[1][:-1]]
    err = decode_error(sample_payload(list(SAMPLE_FIELDS), rows))
    assert "rows[1]" in str(err)
    assert err.field == "rows[1]"
    assert "sample" in str(err)


def test_sample_row_too_wide() -> None:
    """A row with more values than columns is refused too."""
    err = decode_error(sample_payload(list(SAMPLE_FIELDS), [[*SAMPLE_ROWS[0], 0]]))
    assert err.field == "rows[0]"


def test_sample_missing_column() -> None:
    """A sample without a v1 column cannot be read and names the missing column."""
    fields = [f for f in SAMPLE_FIELDS if f != "swap_bytes"]
    rows = [row[:-1] for row in SAMPLE_ROWS]
    err = decode_error(sample_payload(fields, rows))
    assert err.field == "fields"
    assert "swap_bytes" in str(err)


@pytest.mark.parametrize(
    ("column", "value"),
    [("rss_bytes", "512M"), ("pid", True), ("alive", 1), ("start_time", "now"), ("swap_bytes", 1.5)],
)
def test_sample_cell_of_wrong_type(column: str, value: Any) -> None:
    """Each known column is type-checked; the error names the row and the column."""
    row = list(SAMPLE_ROWS[0])
    row[SAMPLE_FIELDS.index(column)] = value
    err = decode_error(sample_payload(list(SAMPLE_FIELDS), [SAMPLE_ROWS[1], row]))
    assert err.field == "rows[1]"
    assert column in str(err)


def test_sample_start_time_refuses_bool() -> None:
    """Like every other float field, a sample's start_time must not accept a bool."""
    row = list(SAMPLE_ROWS[0])
    row[SAMPLE_FIELDS.index("start_time")] = True
    err = decode_error(sample_payload(list(SAMPLE_FIELDS), [row]))
    assert err.field == "rows[0]"


def test_sample_row_must_be_an_array() -> None:
    """A row sent as a map is refused by the schema."""
    err = decode_error(sample_payload(list(SAMPLE_FIELDS), [dict(zip(SAMPLE_FIELDS, SAMPLE_ROWS[0], strict=True))]))
    assert "sample.rows[0]" in str(err)


# --------------------------------------------------------------------------- forward compatibility


def test_unknown_extra_key_is_ignored() -> None:
    """A newer peer may add optional fields; an older one must still decode the frame."""
    frame = decode(packed("attach", id=1, pids=[4242], label="x", priority=5, tags={"a": [1, 2]}))
    assert frame == Attach(id=1, pids=[4242], label="x")


def test_unknown_nested_key_is_ignored() -> None:
    """Extra keys inside nested parts are ignored as well."""
    frame = decode(packed("list_ok", id=4, processes=[info_map(pss_bytes=1234, numa={"0": 1})]))
    assert frame == ListOk(id=4, processes=[TRAINER])


def test_sample_with_appended_column() -> None:
    """A newer agent may append columns; records() still reads the v1 ones by name."""
    fields = [*SAMPLE_FIELDS, "pss_bytes"]
    rows = [[*row, 300 * MiB] for row in SAMPLE_ROWS]
    frame = decode(sample_payload(fields, rows))
    plain = decode(encode_sample(1, 1.0, 1.0, SAMPLE_ROWS, SAMPLE_FIELDS))
    assert isinstance(frame, Sample)
    assert isinstance(plain, Sample)
    assert frame.records() == plain.records()
    assert frame.records()[0].swap_bytes == 2 * MiB


def test_sample_v11_gpu_columns() -> None:
    """v1.1 appends vram_bytes and vram_peak_bytes: int, or nil when unknown."""
    rows = [[*SAMPLE_ROWS[0], 3 * GiB, 4 * GiB], [*SAMPLE_ROWS[1], None, None]]
    frame = decode(encode_sample(1, 1.0, 1.0, rows))
    assert isinstance(frame, Sample)
    assert frame.fields == list(SAMPLE_COLUMNS)
    first, second = frame.records()
    assert (first.vram_bytes, first.vram_peak_bytes) == (3 * GiB, 4 * GiB)
    assert (second.vram_bytes, second.vram_peak_bytes) == (None, None)
    bad = [[*SAMPLE_ROWS[0], "3", None]]
    with pytest.raises(ProtocolError, match=r"rows\[0\]"):
        decode(encode_sample(1, 1.0, 1.0, bad))


def test_sample_with_reordered_columns() -> None:
    """Columns are looked up by name, so their order does not matter."""
    fields = list(reversed(SAMPLE_FIELDS))
    rows = [list(reversed(row)) for row in SAMPLE_ROWS]
    frame = decode(sample_payload(fields, rows))
    assert isinstance(frame, Sample)
    first = frame.records()[0]
    assert (first.pid, first.rss_bytes, first.alive) == (4242, 512 * MiB, True)


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
