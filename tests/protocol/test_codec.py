"""Encoding and validating decoding of memproto frames.

The codec is the daemon's first line of defence against a confused or hostile peer:
every malformed input must become a :class:`ProtocolError` that names the field, never a
``KeyError`` or a crash, and every frame the daemon sends must come back unchanged.
"""

from __future__ import annotations

import pytest
from codec_examples import EXAMPLES, SAMPLE_ROWS, MiB, info_map, packed, sample_payload

from memproto import FRAME_TYPES, PROTOCOL_MAJOR, SAMPLE_FIELDS, decode, encode, encode_sample, frame_bytes, unpack
from memproto.frames import Attach, Attached, AttachOk, Hello, History, ListProcesses, Sample, StatusOk
from memproto.records import Failure, HostMemory, ProcessInfo, ProcessSample, TickStats
from memproto.schema import to_wire

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
