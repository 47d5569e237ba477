"""Detail pane of the selected process: identity and RSS over time with the peak marked
(:class:`RssPanel`) beside its Python stacks (:class:`~memtop.widgets.stack.StackPanel`).
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.widget import Widget

from .. import format as fmt
from ..model import ProcRow, bucket_max
from .stack import StackPanel

_BLOCKS = " ▁▂▃▄▅▆▇█"
CHART_ROWS = 5


def chart(points: list[tuple[float, int]], end: float, seconds: float, width: int, peak: int) -> list[Text]:
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
    row: reactive[ProcRow | None] = reactive(None)
    points: reactive[list[tuple[float, int]]] = reactive(list)
    now: reactive[float] = reactive(0.0)
    window: reactive[float] = reactive(600.0)

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
        head.append(f"  RSS {fmt.size_long(row.rss)}  peak {fmt.size_long(row.peak)}")
        if not row.peak_exact:
            head.append(" (sampled)")
        head.append(f"  anon {fmt.size_long(row.anon)}  swap {fmt.size_long(row.swap)}")
        cmd = Text(" ".join(row.cmdline) or "-", style="dim", no_wrap=True, overflow="ellipsis")
        width = max(10, self.size.width - 2)
        caption = Text(f"RSS, last {self.window / 60:.0f} min, ", style="dim", no_wrap=True, overflow="ellipsis")
        caption.append("█", style="bold red")
        caption.append(" = highest", style="dim")
        lines: list[RenderableType] = [head, cmd, caption]
        lines.extend(chart(self.points, self.now, self.window, width, row.peak))
        return Group(*lines)


class DetailPane(Horizontal):
    """RSS on the left, stacks on the right."""

    def compose(self) -> ComposeResult:
        yield RssPanel()
        yield StackPanel()
