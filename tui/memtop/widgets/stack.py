"""The stack part of the detail pane: latest stack, stack at peak, top growth sites.

Thread names, function names and file paths come from the watched process: they are
data, so they go into ``Text`` objects verbatim and are never parsed as markup.
"""

from __future__ import annotations

import os

from rich.console import Group, RenderableType
from rich.text import Text
from textual.reactive import reactive, var
from textual.widget import Widget

from memproto.frames import StackOk
from memproto.records import StackDump
from memproto.units import format_size
from memproto.vocabulary import StackState

from ..model import Detail

MAX_FRAMES = 6


def _site(name: str, filename: str, line: int | None) -> str:
    where = os.path.basename(filename) + (f":{line}" if line is not None else "")
    return f"{name} ({where})"


def dump_lines(dump: StackDump, title: str, max_frames: int = MAX_FRAMES) -> list[Text]:
    out = [Text.assemble((title, "bold"), (f"  {dump.trigger}, RSS {format_size(dump.rss_bytes, long=True)}", "dim"))]
    # The attributed thread (▶: active with the GIL, else active, else MainThread) in full;
    # the other threads are in `memagent stack PID`.
    threads = dump.threads
    shown = dump.attributed() or (threads[0] if threads else None)
    if shown is not None:
        head = Text("▶ ", style="bold green", no_wrap=True, overflow="ellipsis")
        head.append(shown.name if shown.name is not None else f"thread {shown.thread_id}", style="bold")
        head.append("  active" if shown.active else "  idle", style="green" if shown.active else "dim")
        if shown.owns_gil:
            head.append(" GIL", style="yellow")
        out.append(head)
        for f in shown.frames[:max_frames]:
            out.append(Text("    " + _site(f.name, f.filename, f.line), no_wrap=True, overflow="ellipsis"))
        if len(shown.frames) > max_frames:
            out.append(Text(f"    … {len(shown.frames) - max_frames} more", style="dim"))
    others = len(threads) - 1
    if others > 0:
        out.append(Text(f"  (+{others} other thread{'s' if others > 1 else ''})", style="dim"))
    return out


class StackPanel(Widget):
    detail: var[Detail] = var(Detail)
    reply: reactive[StackOk | None] = reactive(None)
    #: The selected process's stack state when no reply is there yet.
    state: reactive[str | None] = reactive(None)

    def watch_detail(self, detail: Detail) -> None:
        self.reply = detail.stack
        self.state = detail.row.stack_state if detail.row else None

    def render(self) -> RenderableType:
        reply = self.reply
        if reply is None:
            note = {None: "stack: not read yet", StackState.PENDING: "stack: reading…"}.get(
                self.state, f"stack: {self.state}")
            return Text(note, style="dim")
        lines: list[RenderableType] = []
        if reply.state != StackState.OK:
            lines.append(Text(f"stack: {reply.state}" + (f" — {reply.message}" if reply.message else ""),
                              style="yellow"))
        if reply.by_line:
            lines.append(Text("grew at (correlation)", style="bold"))
            for s in reply.by_line[:3]:
                lines.append(Text(f"  {format_size(s.bytes):>6}  {_site(s.function, s.filename, s.line)}",
                                  no_wrap=True, overflow="ellipsis"))
        if reply.at_peak is not None:
            lines.extend(dump_lines(reply.at_peak, "at peak"))
        elif reply.stack_at_peak_state == "missed":
            lines.append(Text("at peak: missed (no stack read while memory rose)", style="dim"))
        if reply.latest is not None and reply.latest is not reply.at_peak and reply.latest != reply.at_peak:
            lines.extend(dump_lines(reply.latest, "latest"))
        if not lines:
            lines.append(Text("stack: none yet", style="dim"))
        return Group(*lines)
