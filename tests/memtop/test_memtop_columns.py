"""memtop's column table and what is derived from it: layout, cells, sorting, the ``s``
cycle and the sort hotkeys. Pure functions: no app, no daemon."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from memtop.app import MemtopApp
from memtop.columns import (
    BY_KEY,
    COLUMNS,
    DEFAULT_SORT,
    HOTKEYS,
    SORT_CYCLE,
    available,
    layout,
    next_in_cycle,
    sort_rows,
)
from memtop.model import ProcRow

MiB = 1024 * 1024
GiB = 1024 * MiB


BASE = ProcRow(1, 1000.0, "python3", None, ("python3", "-m", "model"), 1000, True, 100 * MiB, 200 * MiB, 90 * MiB,
               0, True)


def row(pid: int, **kw: Any) -> ProcRow:
    return replace(BASE, pid=pid, start_time=1000.0 + pid, **kw)


# ---------------------------------------------------------------------- layout

ALL_OPTIONAL = {c.key for c in COLUMNS if c.optional}


def keys(width: int, avail: set[str] = ALL_OPTIONAL) -> list[str]:
    return [c.key for c, _ in layout(width, avail)]


def test_narrow_terminals_drop_the_highest_priority_first() -> None:
    dropped: list[str] = []
    shown = keys(200)
    for width in range(200, 0, -1):
        now = keys(width)
        dropped += [k for k in shown if k not in now and k != "command"]
        shown = now
    assert dropped == ["swap", "stack", "oom", "ns_pid", "vram", "vram_peak", "container", "growth", "share", "rss"]
    assert keys(10) == ["pid", "name", "peak"]  # priority 0: never dropped


def test_every_column_fits_from_112_cells_and_the_name_takes_the_rest() -> None:
    # 12 fixed columns (100 cells with their spaces) + the name at its narrowest (12).
    assert keys(112) == ["pid", "ns_pid", "name", "rss", "peak", "growth", "share", "vram", "vram_peak", "container",
                         "stack", "swap", "oom"]
    assert "swap" not in keys(111)
    widths = dict((c.key, w) for c, w in layout(122, ALL_OPTIONAL))
    assert widths["name"] == 122 - 100 - 1
    assert sum(w + 1 for w in widths.values()) <= 122


def test_the_command_line_gets_what_is_left_on_a_wide_terminal() -> None:
    assert "command" not in keys(161)  # 100 + name 40 + 2: 19 cells left, under its 20
    widths = dict((c.key, w) for c, w in layout(200, ALL_OPTIONAL))
    assert widths["name"] == 40
    assert widths["command"] == 200 - 100 - 40 - 2
    assert keys(200)[-1] == "command"


def test_optional_columns_show_only_with_data() -> None:
    assert not ALL_OPTIONAL & set(keys(200, set()))
    plain = [row(1), row(2)]
    assert available(plain) == set()
    assert available([*plain, row(3, vram=GiB)]) == {"vram"}
    assert available([row(3, vram_peak=0, stack_state="ok")]) == {"vram_peak", "stack"}
    assert available([*plain, row(3, container="web")]) == {"container"}
    assert available([*plain, row(3, ns_pid=1)]) == {"ns_pid"}
    assert available([*plain, row(3, oom_score_adj=800)]) == {"oom"}  # only where the daemon set one
    assert set(keys(200, {"vram"})) & ALL_OPTIONAL == {"vram"}


# ---------------------------------------------------------------------- cells

def test_every_column_renders_its_cell() -> None:
    r = row(4100, label="resnet", cmdline=("python3", "train.py"), rss=int(1.5 * GiB), peak=3 * GiB,
            peak_exact=False, growth=MiB / 60, share=0.25, vram=2 * GiB, vram_peak=None, stack_state="ok",
            swap=512 * 1024, container="llm-server", ns_pid=1, oom_score_adj=-800)
    expected = {
        "pid": "4100", "name": "resnet", "rss": "1.50G", "peak": "3.00G~", "growth": "+1.0M/m", "share": "25%",
        "vram": "2.00G", "vram_peak": "n/a", "stack": "ok", "swap": "512K", "command": "python3 train.py",
        "container": "llm-server", "ns_pid": "1", "oom": "-800",
    }
    assert {c.key: c.cell(r) for c in COLUMNS} == expected
    gone = row(7, name="etl", cmdline=("etl",), alive=False, growth=None, stack_state=None)
    assert (BY_KEY["name"].cell(gone), BY_KEY["rss"].cell(gone)) == ("etl (exited)", "-")
    # No label: the script a Python interpreter runs, not the interpreter (issue 28).
    script = row(8, name="python3", label=None, cmdline=("/root/.pyenv/versions/3.11.7/bin/python3", "serve_yolo.py"))
    assert BY_KEY["name"].cell(script) == "serve_yolo.py"
    # The COMMAND column leaves the program's directory out: the script is what it shows.
    assert BY_KEY["command"].cell(script) == "python3 serve_yolo.py"
    assert (BY_KEY["growth"].cell(gone), BY_KEY["stack"].cell(gone), BY_KEY["peak"].cell(gone)) == ("", "", "200M")


# ---------------------------------------------------------------------- sorting

A = row(10, label="beta", rss=300 * MiB, peak=500 * MiB, growth=None, share=0.25, vram=None, vram_peak=2 * GiB,
        container="web", ns_pid=7, oom_score_adj=800)
B = row(20, name="Alpha", rss=100 * MiB, peak=900 * MiB, growth=5.0, share=0.45, vram=GiB, vram_peak=GiB,
        container="Asr")
C = row(30, label="alpha", rss=200 * MiB, peak=500 * MiB, growth=-1.0, share=0.25, vram=None, vram_peak=None)
D = row(5, label="gamma", rss=400 * MiB, peak=100 * MiB, growth=2.0, share=0.05, vram=3 * GiB, vram_peak=None,
        container="asr", ns_pid=1, oom_score_adj=-800)

#: PIDs in each sortable column's natural order, then reversed. Ties (A and C on peak and
#: share) go by descending PID; rows without a value go last both ways, by PID.
ORDERS = {
    "peak": ([20, 10, 30, 5], [5, 30, 10, 20]),
    "rss": ([5, 10, 30, 20], [20, 30, 10, 5]),
    "growth": ([20, 5, 30, 10], [30, 5, 20, 10]),
    "share": ([20, 10, 30, 5], [5, 30, 10, 20]),
    "pid": ([5, 10, 20, 30], [30, 20, 10, 5]),
    # Display name (label, else name), case-insensitive, then PID: "Alpha" 20, "alpha" 30.
    "name": ([20, 30, 10, 5], [5, 10, 30, 20]),
    "vram": ([5, 20, 10, 30], [20, 5, 10, 30]),
    "vram_peak": ([10, 20, 5, 30], [20, 10, 5, 30]),
    # Case-insensitive, then PID as NAME does ("asr" 5, then "Asr" 20); no container last.
    "container": ([5, 20, 10, 30], [10, 20, 5, 30]),
    # Its PID in its namespace (D 1, A 7); rows outside a nested namespace last.
    "ns_pid": ([5, 10, 20, 30], [10, 5, 20, 30]),
    # The oom_score_adj the daemon set, the kernel's first pick first (A 800, D -800); unset last.
    "oom": ([10, 5, 20, 30], [5, 10, 20, 30]),
}


@pytest.mark.parametrize("column", sorted(ORDERS))
def test_sort_every_column_both_ways(column: str) -> None:
    natural, reverse = ORDERS[column]
    assert [r.pid for r in sort_rows([A, B, C, D], column)] == natural
    assert [r.pid for r in sort_rows([D, C, B, A], column, reverse=True)] == reverse


def test_every_sortable_column_has_its_orders_tested() -> None:
    assert {c.key for c in COLUMNS if c.sortable} == set(ORDERS)


def test_a_column_without_a_sort_key_is_not_sortable() -> None:
    with pytest.raises(ValueError):
        sort_rows([A, B], "stack")


# ---------------------------------------------------------------------- the s cycle and hotkeys

def test_the_s_cycle_order_and_default() -> None:
    assert SORT_CYCLE == ("peak", "rss", "growth", "share", "pid", "name")
    assert DEFAULT_SORT == "peak"
    assert [next_in_cycle(k) for k in SORT_CYCLE] == ["rss", "growth", "share", "pid", "name", "peak"]
    assert next_in_cycle("vram") == "peak"  # a column outside the cycle: back to the start


def test_hotkeys_are_unique_sort_a_sortable_column_and_clash_with_no_binding() -> None:
    declared = [c.hotkey for c in COLUMNS if c.hotkey is not None]
    assert len(declared) == len(set(declared)) == len(HOTKEYS)
    assert {"P": "peak", "M": "rss"}.items() <= {k: c.key for k, c in HOTKEYS.items()}.items()
    assert all(c.sortable for c in HOTKEYS.values())
    bindings = [b for b in MemtopApp.BINDINGS if not isinstance(b, tuple)]
    sort_bindings = {b.key: b for b in bindings if b.action.startswith("sort_by(")}
    assert set(sort_bindings) == set(HOTKEYS)
    assert all(not b.show for b in sort_bindings.values())  # the footer stays as it is
    others = {key for b in bindings if b not in sort_bindings.values() for key in b.key.split(",")}
    assert not others & set(HOTKEYS)
