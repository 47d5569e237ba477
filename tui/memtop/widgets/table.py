"""The process table: a line-API ScrollView that renders only the visible rows.

Why not DataTable: updating 2000 cells of a 1000-row DataTable costs ~115 ms here, and a
clear + re-add ~340 ms; this widget re-sorts a list and renders the 20-50 visible lines,
so an update at 1000 rows costs a few milliseconds. Cells are built as Segments, never
parsed as markup: a process name is data.

Line 0 is the header (click a title to sort by it); rows follow. The columns, how they
drop when they do not fit and which are hidden without data (VRAM without a GPU) are
declared in :mod:`memtop.columns`.

The table is bound to the app's snapshot, sort and filter (``data_bind``) and filters and
sorts for itself. Its inputs are ``var``: new data repaints the visible lines, and a
layout pass (~25 ms of the whole screen at 1000 rows) happens only when the number of
rows changes.
"""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive, var
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ..columns import DEFAULT_SORT, Column, available, layout, sort_rows
from ..model import Key, ProcRow, Snapshot


def _fit(text: str, width: int, right: bool) -> str:
    if cell_len(text) > width:
        return set_cell_size(text[: width * 2], width - 1) + "…" if width > 1 else text[:width]
    pad = width - cell_len(text)
    return " " * pad + text if right else text + " " * pad


class ProcessTable(ScrollView, can_focus=True):
    COMPONENT_CLASSES = {
        "table--header",
        "table--sorted",
        "table--cursor",
        "table--exited",
        "table--hot",
        "table--warm",
    }
    BINDINGS = [
        Binding("up,k", "cursor(-1)", "Up", show=False),
        Binding("down,j", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", show=False),
        Binding("pagedown", "page(1)", show=False),
        Binding("home", "jump(0)", show=False),
        Binding("end", "jump(-1)", show=False),
    ]

    class Highlighted(Message):
        """The cursor moved to another process."""

        def __init__(self, key: Key | None) -> None:
            super().__init__()
            self.key = key

    class SortClicked(Message):
        def __init__(self, column: str) -> None:
            super().__init__()
            self.column = column

    cursor: reactive[int] = reactive(0)
    snapshot: var[Snapshot] = var(Snapshot)
    sort_column: var[str] = var(DEFAULT_SORT)
    sort_reverse: var[bool] = var(False)
    filter_text: var[str] = var("")
    #: The app's selection, kept only when the table has none of its own.
    fallback_key: var[Key | None] = var(None)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        #: What is shown: the snapshot's rows, filtered and sorted.
        self.rows: list[ProcRow] = []
        #: The optional columns some row has data for.
        self.available: set[str] = set()

    # ------------------------------------------------------------------ data

    def watch_snapshot(self) -> None:
        self._show()

    def watch_sort_column(self) -> None:
        self._show()

    def watch_sort_reverse(self) -> None:
        self._show()

    def watch_filter_text(self) -> None:
        self._show()

    def _show(self) -> None:
        """Filter and sort the snapshot's rows and show them. The cursor stays on the
        process it was on (the table's own selection is the truth: the app learns of
        cursor moves by message, so its copy may lag)."""
        snap, needle = self.snapshot, self.filter_text
        rows = sort_rows([r for r in snap.rows if r.matches(needle)] if needle else snap.rows,
                         self.sort_column, self.sort_reverse)
        keep = self.selected_key or self.fallback_key
        self.rows = rows
        self.available = available(snap.rows)
        index = next((i for i, r in enumerate(rows) if r.key == keep), None)
        self.virtual_size = Size(self.content_width, len(rows) + 1)
        if index is not None:
            self.set_reactive(ProcessTable.cursor, index)
        else:
            self.set_reactive(ProcessTable.cursor, min(self.cursor, max(0, len(rows) - 1)))
            self.post_message(self.Highlighted(self.selected_key))
        self._scroll_cursor_into_view()
        self.refresh()

    @property
    def selected(self) -> ProcRow | None:
        return self.rows[self.cursor] if 0 <= self.cursor < len(self.rows) else None

    @property
    def selected_key(self) -> Key | None:
        row = self.selected
        return row.key if row else None

    def watch_cursor(self, old: int, new: int) -> None:
        self._scroll_cursor_into_view()
        self.refresh()
        self.post_message(self.Highlighted(self.selected_key))

    def _scroll_cursor_into_view(self) -> None:
        visible = max(1, self.size.height - 1)
        top = round(self.scroll_offset.y)
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + visible:
            self.scroll_to(y=self.cursor - visible + 1, animate=False)

    # ------------------------------------------------------------------ actions

    def _move_to(self, index: int) -> None:
        if self.rows:
            self.cursor = max(0, min(len(self.rows) - 1, index))

    def action_cursor(self, delta: int) -> None:
        self._move_to(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        self._move_to(self.cursor + direction * max(1, self.size.height - 2))

    def action_jump(self, where: int) -> None:
        self._move_to(where if where >= 0 else len(self.rows) - 1)

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        if offset.y == 0:
            x = 0
            for col, width in layout(self.content_width, self.available):
                if x <= offset.x < x + width + 1:
                    self.post_message(self.SortClicked(col.key))
                    return
                x += width + 1
            return
        self._move_to(round(self.scroll_offset.y) + offset.y - 1)

    # ------------------------------------------------------------------ rendering

    @property
    def content_width(self) -> int:
        """Width left for cells once the vertical scrollbar is drawn."""
        return self.scrollable_content_region.width

    def render_line(self, y: int) -> Strip:
        width = self.content_width
        cols = layout(width, self.available)
        if y == 0:
            return self._header(cols, width)
        index = round(self.scroll_offset.y) + y - 1
        if index >= len(self.rows):
            return Strip.blank(width, self.rich_style)
        return self._row(self.rows[index], index == self.cursor, cols, width)

    def _header(self, cols: list[tuple[Column, int]], width: int) -> Strip:
        base = self.get_component_rich_style("table--header")
        sorted_style = self.get_component_rich_style("table--sorted")
        segments = []
        for col, w in cols:
            title = col.title
            if col.key == self.sort_column:
                title += "▲" if self.sort_reverse else "▼"
            style = sorted_style if col.key == self.sort_column else base
            segments.append(Segment(_fit(title, w, col.align_right), style))
            segments.append(Segment(" ", base))
        return Strip(segments).adjust_cell_length(width, base)

    def _row(self, row: ProcRow, selected: bool, cols: list[tuple[Column, int]], width: int) -> Strip:
        base = self.rich_style
        if not row.alive:
            base = base + self.get_component_rich_style("table--exited")
        hot: Style | None = None
        if row.share >= 0.5:
            hot = self.get_component_rich_style("table--hot")
        elif row.share >= 0.25:
            hot = self.get_component_rich_style("table--warm")
        segments = []
        for col, w in cols:
            style = base + hot if hot is not None and col.heat else base
            segments.append(Segment(_fit(col.cell(row), w, col.align_right), style))
            segments.append(Segment(" ", base))
        strip = Strip(segments).adjust_cell_length(width, base)
        if selected:
            strip = strip.apply_style(self.get_component_rich_style("table--cursor"))
        return strip
