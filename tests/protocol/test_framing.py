"""Length-prefixed framing of the msgpack stream.

A stream socket hands over bytes in arbitrary pieces; the framing must reassemble frames
exactly, whatever the split, and must refuse an oversized frame from its header alone so a
peer cannot make the daemon buffer what it announced.
"""

from __future__ import annotations

import socket
import struct

import pytest

from memproto import FrameBuffer, FrameTooLarge, ProtocolError, decode, encode, frame_bytes
from memproto.frames import Ack, Attach, Dropped, Frame
from memproto.limits import HEADER_BYTES, MAX_CLIENT_FRAME_BYTES, MAX_FRAME_BYTES

PAYLOADS: list[bytes] = [b"first", b"", b"\x00" * 300, bytes(range(256)) * 3]


def header(size: int) -> bytes:
    """A length prefix announcing ``size`` bytes."""
    return struct.pack(">I", size)


def test_frame_bytes_prefixes_big_endian_length() -> None:
    """The wire format is a 4-byte big-endian length, then the payload."""
    assert HEADER_BYTES == 4
    assert frame_bytes(b"abc") == b"\x00\x00\x00\x03abc"
    payload = b"x" * 0x010203
    framed = frame_bytes(payload)
    assert framed[:4] == b"\x00\x01\x02\x03"
    assert framed[4:] == payload


def test_zero_length_frame() -> None:
    """Framing passes an empty payload through intact; decoding then refuses it (it holds no object)."""
    assert frame_bytes(b"") == b"\x00\x00\x00\x00"
    buf = FrameBuffer()
    assert buf.feed(frame_bytes(b"") + frame_bytes(b"next")) == [b"", b"next"]
    assert buf.pending == 0
    with pytest.raises(ProtocolError):
        decode(b"")


def test_concatenated_frames_are_split() -> None:
    """One recv may carry several frames; each comes out whole and in order."""
    buf = FrameBuffer()
    assert buf.feed(b"".join(frame_bytes(p) for p in PAYLOADS)) == PAYLOADS
    assert buf.pending == 0


def test_frames_fed_one_byte_at_a_time() -> None:
    """The worst split: every byte in its own recv."""
    stream = b"".join(frame_bytes(p) for p in PAYLOADS)
    buf = FrameBuffer()
    out: list[bytes] = []
    for i in range(len(stream)):
        out += buf.feed(stream[i : i + 1])
    assert out == PAYLOADS
    assert buf.pending == 0


@pytest.mark.parametrize("cut", [1, 3, 4, 5, 9, 12])
def test_every_split_point_gives_the_same_frames(cut: int) -> None:
    """Splitting the stream anywhere, header included, changes nothing."""
    stream = frame_bytes(b"hello") + frame_bytes(b"world!")
    buf = FrameBuffer()
    out = buf.feed(stream[:cut]) + buf.feed(stream[cut:])
    assert out == [b"hello", b"world!"]
    assert buf.pending == 0


def test_partial_data_is_kept_pending() -> None:
    """Bytes of an incomplete frame wait in the buffer until the rest arrives."""
    buf = FrameBuffer()
    framed = frame_bytes(b"abcdef")
    assert buf.feed(framed[:2]) == []
    assert buf.pending == 2
    assert buf.feed(framed[2:7]) == []
    assert buf.pending == 7
    assert buf.feed(framed[7:] + framed[:5]) == [b"abcdef"]
    assert buf.pending == 5
    assert buf.feed(framed[5:]) == [b"abcdef"]
    assert buf.pending == 0


def test_feeding_nothing_is_harmless() -> None:
    """An empty read produces no frame and keeps what was pending."""
    buf = FrameBuffer()
    assert buf.feed(b"") == []
    buf.feed(b"\x00\x00")
    assert buf.feed(b"") == []
    assert buf.pending == 2


def test_oversized_header_raises_before_the_body_arrives() -> None:
    """The header alone is enough to refuse: nothing of the announced body is awaited."""
    buf = FrameBuffer(max_frame=1024)
    with pytest.raises(FrameTooLarge) as info:
        buf.feed(header(1025))
    assert (info.value.size, info.value.limit) == (1025, 1024)
    assert info.value.code == "too_large"
    assert isinstance(info.value, ProtocolError)


def test_oversized_header_split_across_reads() -> None:
    """The check fires as soon as the fourth header byte arrives."""
    buf = FrameBuffer(max_frame=MAX_CLIENT_FRAME_BYTES)
    big = header(MAX_CLIENT_FRAME_BYTES + 1)
    assert buf.feed(big[:3]) == []
    with pytest.raises(FrameTooLarge):
        buf.feed(big[3:])


def test_oversized_frame_after_good_ones() -> None:
    """A huge header behind valid frames is still refused, whatever came before."""
    buf = FrameBuffer(max_frame=100)
    with pytest.raises(FrameTooLarge):
        buf.feed(frame_bytes(b"ok") + header(0xFFFFFFFF))


def test_frame_at_the_limit_is_accepted() -> None:
    """``max_frame`` is inclusive."""
    buf = FrameBuffer(max_frame=1000)
    payload = b"p" * 1000
    assert buf.feed(frame_bytes(payload)) == [payload]


def test_default_limit_is_max_frame_bytes() -> None:
    """Without an argument the buffer uses the protocol-wide limit."""
    buf = FrameBuffer()
    assert buf.feed(header(MAX_FRAME_BYTES)) == []
    with pytest.raises(FrameTooLarge):
        FrameBuffer().feed(header(MAX_FRAME_BYTES + 1))


def test_frame_bytes_refuses_payload_above_max() -> None:
    """The sender refuses what no receiver would accept."""
    assert len(frame_bytes(b"\x00" * MAX_FRAME_BYTES)) == MAX_FRAME_BYTES + HEADER_BYTES
    with pytest.raises(FrameTooLarge) as info:
        frame_bytes(b"\x00" * (MAX_FRAME_BYTES + 1))
    assert info.value.size == MAX_FRAME_BYTES + 1
    assert info.value.limit == MAX_FRAME_BYTES


def test_frames_across_a_real_socket() -> None:
    """Encoded frames written to a stream socket come out of FrameBuffer decoded and equal."""
    frames: list[Frame] = [Attach(id=1, pids=list(range(1000, 1500))), Ack(id=1), Dropped(count=3)]
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"".join(frame_bytes(encode(f)) for f in frames))
        left.shutdown(socket.SHUT_WR)
        buf = FrameBuffer()
        received: list[Frame] = []
        while chunk := right.recv(7):
            received += [decode(p) for p in buf.feed(chunk)]
    assert received == frames
    assert buf.pending == 0
