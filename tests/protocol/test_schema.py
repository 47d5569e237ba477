"""memproto.schema: wire types are compiled at their first decode, not at import (the
CLI's start, issue 26), and every declared type still compiles. And the frames' and
records' modules are imported where used: importing memproto creates the session's
frames alone."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

import memproto
from memproto import schema
from memproto.frames import FRAME_TYPES


def test_every_frame_and_record_type_compiles() -> None:
    every_frame = set(FRAME_TYPES.values())  # imports every frame's module, and so every record's
    schema.compile_all()
    assert every_frame <= schema._WIRE
    assert all(cls in schema._SPECS for cls in schema._WIRE)


def test_a_type_that_is_not_wire_is_refused_at_its_decode() -> None:
    @dataclass
    class Plain:
        x: int

    with pytest.raises(TypeError, match="not a wire type"):
        schema.from_wire(Plain, {"x": 1})


def test_an_unsupported_field_type_is_named_at_the_first_decode() -> None:
    @schema.wire
    @dataclass
    class Odd:
        x: dict[str, int]

    with pytest.raises(TypeError, match="unsupported wire type"):
        schema.from_wire(Odd, {"x": {}})


@pytest.mark.e2e  # a fresh interpreter: what import alone compiles
def test_importing_the_protocol_compiles_no_spec() -> None:
    code = ("import memproto.schema as s, memproto; eager = len(s._WIRE); import memproto.frames as f; "
            "every = list(f.FRAME_TYPES.values()); print(len(s._SPECS), eager, len(s._WIRE))")
    compiled, eager, declared = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True,
                                                        text=True, check=True).stdout.split())
    assert compiled == 0 and declared >= 40
    # hello, ack, error: what every client decodes; the other 40 wait for their first use
    assert eager == 3
    assert memproto.PROTOCOL_MAJOR == 1
