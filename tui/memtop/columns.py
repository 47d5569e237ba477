"""The process table's columns, declared once.

Each :class:`Column` says how it looks (title, width, alignment), when it shows (priority
on a narrow terminal, optional columns only when some row has data), what its cells say,
and how it sorts (key, natural direction, place in the ``s`` cycle, hotkey). The table's
layout, header and cells, :func:`sort_rows`, the ``s`` cycle and the app's direct sort
keys are all derived from :data:`COLUMNS`, so a column is added or changed in one place.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter

from memproto.units import format_size

from . import format as fmt
from .model import ProcRow

#: What a sortable column sorts on: the value, then a tie-break (see :func:`_by`).
SortKey = tuple[float, int] | tuple[str, int]


def _by(value: Callable[[ProcRow], float | None]) -> Callable[[ProcRow], SortKey | None]:
    """Sort on ``value``, equal values by descending PID (the newer process first, the
    same in both directions); None where the row has no value: it sorts last."""

    def key(row: ProcRow) -> SortKey | None:
        v = value(row)
        return None if v is None else (v, -row.pid)

    return key


def _by_name(row: ProcRow) -> SortKey:
    """What people read (label, else process name), case-insensitive; then by PID."""
    return (row.display_name.lower(), row.pid)


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    title: str
    #: Cells; for the flexible column (:attr:`max_width`) its narrowest.
    width: int
    #: Narrow terminals drop the highest priority first; 0 is never dropped.
    priority: int
    cell: Callable[[ProcRow], str]
    align_right: bool = True
    #: Set on an optional column: shown only when some row has data for it (VRAM on a
    #: box with GPUs, stack states once the daemon reads stacks).
    has_data: Callable[[ProcRow], bool] | None = None
    #: None: not sortable. A row whose key is None sorts last in both directions.
    sort_key: Callable[[ProcRow], SortKey | None] | None = None
    #: The natural direction: biggest first for sizes, A→Z and low PIDs first otherwise.
    descending: bool = False
    #: Place in the ``s`` cycle (0 first, also the default sort); None: not in it.
    cycle: int | None = None
    #: A key that sorts by this column directly (htop's P and M).
    hotkey: str | None = None
    #: The one flexible column: grows up to this width into the room the others leave.
    max_width: int | None = None
    #: Shown only in the width left once every other column fits (the command line).
    leftover: bool = False
    #: Coloured by the process's share of Σ peaks (hot, warm).
    heat: bool = False

    @property
    def optional(self) -> bool:
        return self.has_data is not None

    @property
    def sortable(self) -> bool:
        return self.sort_key is not None



def command_text(cmdline: Sequence[str]) -> str:
    """The command line with its program's directory left out (``python3.11 serve.py
    --port 80``): a pyenv interpreter's long path took the column and cut the script name,
    the part that matters (issue 28); the whole line is in the detail pane."""
    if not cmdline:
        return ""
    return " ".join([os.path.basename(cmdline[0]) or cmdline[0], *cmdline[1:]])

COLUMNS: tuple[Column, ...] = (
    Column("pid", "PID", 7, 0, lambda r: str(r.pid), sort_key=_by(lambda r: r.pid), cycle=4, hotkey="I"),
    Column("ns_pid", "NSPID", 5, 3, lambda r: "" if r.ns_pid is None else str(r.ns_pid),
           has_data=lambda r: r.ns_pid is not None, sort_key=_by(lambda r: r.ns_pid)),
    Column("name", "NAME", 12, 0, lambda r: r.display_name + ("" if r.alive else " (exited)"), align_right=False,
           sort_key=_by_name, cycle=5, hotkey="N", max_width=40),
    Column("rss", "RSS", 7, 1, lambda r: format_size(r.rss) if r.alive else "-",
           sort_key=_by(lambda r: r.rss), descending=True, cycle=1, hotkey="M"),
    Column("peak", "PEAK", 7, 0, lambda r: format_size(r.peak) + ("" if r.peak_exact else "~"),
           sort_key=_by(lambda r: r.peak), descending=True, cycle=0, hotkey="P", heat=True),
    Column("growth", "GROWTH", 9, 2, lambda r: fmt.growth(r.growth),
           sort_key=_by(lambda r: r.growth), descending=True, cycle=2, hotkey="G"),
    Column("share", "SHARE", 5, 2, lambda r: fmt.percent(r.share),
           sort_key=_by(lambda r: r.share), descending=True, cycle=3, hotkey="S", heat=True),
    Column("vram", "VRAM", 7, 3, lambda r: format_size(r.vram), has_data=lambda r: r.vram is not None,
           sort_key=_by(lambda r: r.vram), descending=True, hotkey="V"),
    Column("vram_peak", "PK VRAM", 7, 3, lambda r: format_size(r.vram_peak),
           has_data=lambda r: r.vram_peak is not None, sort_key=_by(lambda r: r.vram_peak), descending=True),
    Column("container", "CONTAINER", 14, 3, lambda r: r.container or "", align_right=False,
           has_data=lambda r: r.container is not None, sort_key=lambda r: None if r.container is None else
           (r.container.lower(), r.pid), hotkey="C"),
    Column("stack", "STACK", 8, 4, lambda r: r.stack_state or "", align_right=False,
           has_data=lambda r: bool(r.stack_state)),
    Column("swap", "SWAP", 6, 5, lambda r: format_size(r.swap)),
    # The oom_score_adj the daemon set ([oom_score_adj]): which model the kernel takes first.
    Column("oom", "OOMADJ", 6, 4, lambda r: "" if r.oom_score_adj is None else str(r.oom_score_adj),
           has_data=lambda r: r.oom_score_adj is not None, sort_key=_by(lambda r: r.oom_score_adj), descending=True),
    Column("command", "COMMAND", 20, 9, lambda r: command_text(r.cmdline), align_right=False, leftover=True),
)
BY_KEY: dict[str, Column] = {c.key: c for c in COLUMNS}
#: The flexible column (the name), sized after the others.
FLEX = next(c for c in COLUMNS if c.max_width is not None)
#: The ``s`` cycle; its first column is the default sort ("peak offenders first").
SORT_CYCLE: tuple[str, ...] = tuple(
    c.key for c in sorted((c for c in COLUMNS if c.cycle is not None), key=lambda c: c.cycle or 0)
)
DEFAULT_SORT = SORT_CYCLE[0]
#: Direct sort keys: hotkey → column.
HOTKEYS: dict[str, Column] = {c.hotkey: c for c in COLUMNS if c.hotkey is not None}


def layout(width: int, available: set[str]) -> list[tuple[Column, int]]:
    """Columns that fit in ``width`` cells, each with its width (1 space between).

    Optional columns not in ``available`` are left out; then, while the fixed columns and
    the flexible one at its narrowest do not fit, the highest-priority column goes (never
    below three columns nor a priority-0 one). The flexible column takes the rest up to
    its maximum, and leftover columns are added when they fit in what remains after it.
    """
    cols = [c for c in COLUMNS if not c.leftover and (not c.optional or c.key in available)]
    while True:
        fixed = sum(c.width + 1 for c in cols if c is not FLEX)
        if fixed + FLEX.width <= width or len(cols) <= 3:
            break
        drop = max((c for c in cols if c.priority > 0), key=lambda c: c.priority, default=None)
        if drop is None:
            break
        cols.remove(drop)
    rest = width - sum(c.width + 1 for c in cols if c is not FLEX)
    flex_width = max(FLEX.width, min(FLEX.max_width or FLEX.width, rest - 1))
    out = [(c, flex_width if c is FLEX else c.width) for c in cols]
    # A wide terminal gets the command line in the room left over.
    left = rest - flex_width - 2
    for c in COLUMNS:
        if c.leftover and left >= c.width:
            out.append((c, left))
    return out


def available(rows: Iterable[ProcRow]) -> set[str]:
    """The optional columns some row has data for."""
    rows = tuple(rows)
    return {c.key for c in COLUMNS if c.has_data is not None and any(map(c.has_data, rows))}


def sort_rows(rows: Iterable[ProcRow], column: str, reverse: bool = False) -> list[ProcRow]:
    """Sorted view by ``column`` in its natural direction (``reverse``: the other one);
    rows without a value sort last whichever the direction, by PID."""
    key = BY_KEY[column].sort_key
    if key is None:
        raise ValueError(f"column {column!r} is not sortable")
    keyed = [(key(r), r) for r in rows]
    present = [(k, r) for k, r in keyed if k is not None]
    present.sort(key=itemgetter(0), reverse=BY_KEY[column].descending != reverse)
    missing = sorted((r for k, r in keyed if k is None), key=lambda r: r.pid)
    return [r for _, r in present] + missing


def next_in_cycle(column: str) -> str:
    """The column ``s`` sorts by after ``column`` (the first when it is not in the cycle)."""
    i = SORT_CYCLE.index(column) if column in SORT_CYCLE else -1
    return SORT_CYCLE[(i + 1) % len(SORT_CYCLE)]
