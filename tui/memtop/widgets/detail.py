"""Detail pane of the selected process: identity and RSS over time with the peak marked
(:class:`RssPanel`) beside its Python stacks (:class:`~memtop.widgets.stack.StackPanel`).

Both panels are bound to the app's :class:`~memtop.model.Detail`; each takes what it
shows from it, and repaints only when that changed.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.text import Text
from textual.containers import Horizontal
from textual.reactive import reactive, var
from textual.widget import Widget

from memproto.units import format_size

from ..model import Detail, ProcRow, bucket_max

_BLOCKS = " ▁▂▃▄▅▆▇█"
CHART_ROWS = 5


def chart(points: Sequence[tuple[float, int]], end: float, seconds: float, width: int, peak: int) -> list[Text]:
    """RSS over the last ``seconds`` as a ``CHART_ROWS``-line block chart; the column
    holding the highest value is marked, and the scale tops at ``peak``."""
    buckets = bucket_max(points, end - seconds, end, width)
    top = max([peak, *(v for v in buckets if v is not None)] or [1]) or 1
    best = max(range(width), key=lambda i: buckets[i] or -1, default=0)
    lines = []
    for level in range(CHART_ROWS, 0, -1):
        chars = []
        for v in buckets:
            if v is None:
                chars.append(" ")
            else:
                eighths = v / top * CHART_ROWS * 8 - (level - 1) * 8
                chars.append(_BLOCKS[max(0, min(8, round(eighths)))])
        line = Text("".join(chars), style="cyan")
        if buckets and buckets[best]:
            line.stylize("bold red", best, best + 1)
        lines.append(line)
    return lines


class RssPanel(Widget):
    detail: var[Detail] = var(Detail)
    row: reactive[ProcRow | None] = reactive(None)
    points: reactive[Sequence[tuple[float, int]]] = reactive(tuple)
    now: reactive[float] = reactive(0.0)
    window: reactive[float] = reactive(600.0)

    def watch_detail(self, detail: Detail) -> None:
        self.row, self.points, self.now = detail.row, detail.points, detail.now

    def render(self) -> RenderableType:
        row = self.row
        if row is None:
            return Text("no process selected", style="dim")
        head = Text(no_wrap=True, overflow="ellipsis")
        head.append(f"{row.pid} ", style="bold")
        head.append(row.display_name, style="bold")
        if row.label:
            head.append(f" ({row.name})")
        head.append("  alive" if row.alive else "  exited", style="green" if row.alive else "dim")
        head.append(f"  RSS {format_size(row.rss, long=True)}  peak {format_size(row.peak, long=True)}")
        if not row.peak_exact:
            head.append(" (sampled)")
        head.append(f"  anon {format_size(row.anon, long=True)}  swap {format_size(row.swap, long=True)}")
        cmd = Text(" ".join(row.cmdline) or "-", style="dim", no_wrap=True, overflow="ellipsis")
        width = max(10, self.size.width - 2)
        caption = Text(f"RSS, last {self.window / 60:.0f} min, ", style="dim", no_wrap=True, overflow="ellipsis")
        caption.append("█", style="bold red")
        caption.append(" = highest", style="dim")
        lines: list[RenderableType] = [head, cmd, caption]
        lines.extend(chart(self.points, self.now, self.window, width, row.peak))
        return Group(*lines)


class DetailPane(Horizontal):
    """RSS on the left, stacks on the right; the app composes both panels into it (they
    are bound to the app's reactives, and data_bind binds to the composing node)."""

    #: Bound to the app's ``show_detail``.
    shown: var[bool] = var(True)

    def watch_shown(self, shown: bool) -> None:
        self.display = shown
