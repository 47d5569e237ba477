"""Sample frames: column checks, and forward compatibility of every frame (part of the codec tests)."""

from __future__ import annotations

from typing import Any

import pytest
from codec_examples import SAMPLE_ROWS, TRAINER, GiB, MiB, decode_error, info_map, packed, sample_payload

from memproto import SAMPLE_COLUMNS, SAMPLE_FIELDS, ProtocolError, decode, encode_sample
from memproto.frames import Attach, ListOk, Sample

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


#: The columns a v1.1 to v1.4 agent sends.
V11_COLUMNS = (*SAMPLE_FIELDS, "vram_bytes", "vram_peak_bytes")


def test_sample_v11_gpu_columns() -> None:
    """v1.1 appends vram_bytes and vram_peak_bytes: int, or nil when unknown."""
    rows = [[*SAMPLE_ROWS[0], 3 * GiB, 4 * GiB], [*SAMPLE_ROWS[1], None, None]]
    frame = decode(encode_sample(1, 1.0, 1.0, rows, V11_COLUMNS))
    assert isinstance(frame, Sample)
    assert frame.fields == list(V11_COLUMNS)
    first, second = frame.records()
    assert (first.vram_bytes, first.vram_peak_bytes) == (3 * GiB, 4 * GiB)
    assert (second.vram_bytes, second.vram_peak_bytes) == (None, None)
    bad = [[*SAMPLE_ROWS[0], "3", None]]
    with pytest.raises(ProtocolError, match=r"rows\[0\]"):
        decode(encode_sample(1, 1.0, 1.0, bad, V11_COLUMNS))


def test_sample_v15_peak_exact_column() -> None:
    """v1.5 appends rss_peak_exact, after the v1.1 columns; v1.10 oom_score_adj: what this
    agent sends."""
    assert SAMPLE_COLUMNS == (*V11_COLUMNS, "rss_peak_exact", "oom_score_adj")
    rows = [[*SAMPLE_ROWS[0], None, None, False, None], [*SAMPLE_ROWS[1], 3 * GiB, 4 * GiB, True, -800]]
    frame = decode(encode_sample(1, 1.0, 1.0, rows))
    assert isinstance(frame, Sample)
    assert frame.fields == list(SAMPLE_COLUMNS)
    first, second = frame.records()
    assert (first.rss_peak_exact, second.rss_peak_exact) == (False, True)
    assert (second.vram_bytes, second.vram_peak_bytes) == (3 * GiB, 4 * GiB)
    assert (first.oom_score_adj, second.oom_score_adj) == (None, -800)


def test_sample_oom_score_adj_is_an_int_or_nil() -> None:
    """v1.10's oom_score_adj: an int (the value the daemon set) or nil; a bool is no int."""
    row = [*SAMPLE_ROWS[0], None, None, True, True]
    err = decode_error(sample_payload(list(SAMPLE_COLUMNS), [row]))
    assert err.field == "rows[0]" and "oom_score_adj" in str(err)


@pytest.mark.parametrize("fields", [SAMPLE_FIELDS, V11_COLUMNS], ids=["v1.0", "v1.1"])
def test_sample_without_peak_exact_decodes_with_nil(fields: tuple[str, ...]) -> None:
    """An older agent's frame has no rss_peak_exact: nil, and a client keeps the list's flag."""
    rows = [row + [None] * (len(fields) - len(row)) for row in SAMPLE_ROWS]
    frame = decode(encode_sample(1, 1.0, 1.0, rows, fields))
    assert isinstance(frame, Sample)
    assert [r.rss_peak_exact for r in frame.records()] == [None, None]


@pytest.mark.parametrize("value", [1, 0, 1.0, "true", None, [True]])
def test_sample_peak_exact_must_be_a_bool(value: Any) -> None:
    """rss_peak_exact is a bool; an int is not taken for one (as for ``alive``), and nil is
    not sent: the agent always knows the flag (nil means only "column absent")."""
    row = [*SAMPLE_ROWS[0], None, None, value, None]
    err = decode_error(sample_payload(list(SAMPLE_COLUMNS), [[*SAMPLE_ROWS[1], None, None, True, None], row]))
    assert err.field == "rows[1]"
    assert "rss_peak_exact" in str(err)


def test_sample_with_reordered_columns() -> None:
    """Columns are looked up by name, so their order does not matter."""
    fields = list(reversed(SAMPLE_FIELDS))
    rows = [list(reversed(row)) for row in SAMPLE_ROWS]
    frame = decode(sample_payload(fields, rows))
    assert isinstance(frame, Sample)
    first = frame.records()[0]
    assert (first.pid, first.rss_bytes, first.alive) == (4242, 512 * MiB, True)


def test_validate_by_shapes_takes_and_refuses_what_value_by_value_did() -> None:
    """``Sample.validate`` checks each distinct shape of row (its values' exact types) once:
    an int subclass still passes (value by value), a bool in an int column or a float PID
    is still refused with its row, and a short row anywhere is named."""
    import enum

    class Count(enum.IntEnum):
        ONE = 1

    rows = [[*SAMPLE_ROWS[0], None, None, True, None] for _ in range(50)]
    Sample(1, 1.0, 1.0, list(SAMPLE_COLUMNS), [*rows, [Count.ONE, *rows[0][1:]]]).validate()
    for col, bad in ((SAMPLE_COLUMNS.index("rss_bytes"), True), (SAMPLE_COLUMNS.index("pid"), 1.5)):
        row = list(rows[0])
        row[col] = bad
        with pytest.raises(ProtocolError, match=SAMPLE_COLUMNS[col]) as err:
            Sample(1, 1.0, 1.0, list(SAMPLE_COLUMNS), [*rows, row]).validate()
        assert err.value.field == "rows[50]"
    width = len(SAMPLE_COLUMNS)
    with pytest.raises(ProtocolError, match=f"row has {width - 1} values for {width} columns") as err:
        Sample(1, 1.0, 1.0, list(SAMPLE_COLUMNS), [*rows[:7], rows[0][:-1], *rows]).validate()
    assert err.value.field == "rows[7]"
