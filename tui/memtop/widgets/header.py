"""The header: connection state, host memory bar, Σ peaks gauge, GPU bars, and a Σ peaks
gauge per memory cgroup limit the daemon reports (a container's, docs/headroom.md).

It renders from two immutable inputs bound to the app's (``data_bind``): the latest
:class:`Snapshot` and the :class:`LinkState`. Process names never appear here, and no
markup is parsed; a container's name is shown with its control characters escaped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from memproto.records import Headroom
from memproto.text import printable
from memproto.units import format_size
from memproto.vocabulary import Resource

from .. import format as fmt
from ..model import Snapshot

if TYPE_CHECKING:
    from ..replay_types import ReplayState

#: At most this many cgroup limit gauges, the fullest first; the last says how many more.
MAX_LIMITS = 3
EMBEDDED_NOTE = "embedded agent — run `memagent daemon` for always-on monitoring and alerts"


@dataclass(frozen=True, slots=True)
class LinkState:
    connected: bool = False
    path: str = ""
    embedded: bool = False
    #: Why we are disconnected, or what we are doing.
    message: str = "connecting…"
    paused: bool = False
    #: Failed tries since the link was last up (0: none yet).
    attempt: int = 0
    #: A link was up before: the daemon went away (restart, crash) and is reconnected to.
    lost: bool = False

    def status(self) -> tuple[str, str]:
        """What the header says while disconnected: the state, then the reason."""
        tries = f" (attempt {self.attempt})" if self.attempt else ""
        if self.lost:
            return f"daemon lost — reconnecting{tries}…", self.message
        if self.attempt:
            return f"disconnected — retrying{tries}…", self.message
        return "disconnected", self.message


class LinkNotice(Widget):
    """While disconnected, the whole reason, wrapped, under the header (whose status line
    cuts it at the edge, to keep the gauges in place): a refused connect says which group
    to join and how (issue 28: memtop retried for ever with the reason cut off)."""

    link: reactive[LinkState] = reactive(LinkState)

    def watch_link(self, link: LinkState) -> None:
        self.display = not link.connected and bool(link.message)

    def render(self) -> RenderableType:
        state, reason = self.link.status()
        text = Text(f"{state}\n", style="bold red")
        text.append(printable(reason))
        return text


class MemHeader(Widget):
    # Repaint only: a layout pass of the whole screen costs ~25 ms at 1000 rows. The
    # header's height changes only with the number of GPUs or the embedded note.
    snapshot: reactive[Snapshot] = reactive(Snapshot)
    link: reactive[LinkState] = reactive(LinkState)
    #: In a replay (``memtop --replay``): what the status line says instead of the link's.
    replay: reactive[ReplayState | None] = reactive(None)
    _lines = 0

    def _check_height(self) -> None:
        lines = 3 + len(self.snapshot.gpus) + len(self._limits()[:MAX_LIMITS]) + (1 if self.link.embedded else 0)
        if lines != self._lines:
            self._lines = lines
            self.refresh(layout=True)

    def watch_snapshot(self) -> None:
        self._check_height()

    def watch_link(self) -> None:
        self._check_height()

    def render(self) -> RenderableType:
        lines = [self._status_line(), self._host_line(), self._peaks_line(), *self._limit_lines(),
                 *self._gpu_lines()]
        if self.link.embedded:
            lines.append(Text(EMBEDDED_NOTE, style="italic"))
        return Group(*lines)

    def _status_line(self) -> Text:
        """While disconnected: one line, the reason last and cut at the edge where it is too
        long (wrapped, it would push the Σ peaks gauge off the header)."""
        link, snap = self.link, self.snapshot
        text = Text("memtop ", style="bold", no_wrap=not link.connected, overflow="ellipsis")
        if self.replay is not None:  # one line: the header's height does not follow a wrap
            text.no_wrap = True
            text.append_text(self.replay.status())
        elif link.connected:
            text.append("● ", style="green")
            text.append("embedded agent" if link.embedded else link.path)
        else:
            text.append(f"● {link.status()[0]}", style="bold red")
        if snap.interval:
            text.append(f"  every {snap.interval:g}s")
        text.append(f"  watched {len(snap.rows)}")
        if snap.exited:
            text.append(f" ({snap.exited} exited)")
        hidden = (snap.watched_total or 0) - len(snap.rows)
        if hidden > 0:  # others' processes: not listed, but in the box's Σ peaks
            text.append(f"  +{hidden} not yours, in Σ", style="dim")
        if snap.dropped:
            text.append(f"  dropped {snap.dropped}", style="yellow")
        if link.paused:
            text.append("  PAUSED", style="bold yellow")
        if not link.connected:
            text.append(f"  {link.message}", style="red")
        return text

    def _gauge(self, label: str, value: int, total: int | None, warn: float, crit: float) -> Text:
        width = max(10, self.size.width - 48)
        text = Text(f"{label:<9}", no_wrap=True, overflow="ellipsis")
        if not total:
            text.append(fmt.bar(0, width, "dim"))
            text.append(f" {format_size(value, long=True)} of n/a")
            return text
        fraction = value / total
        style = fmt.level_style(fraction, warn, crit)
        text.append(fmt.bar(fraction, width, style))
        text.append(f" {format_size(value, long=True)} / {format_size(total, long=True)} ")
        text.append(f"{fmt.percent(fraction)}", style=style)
        return text

    def _host_line(self) -> Text:
        host = self.snapshot.host
        return self._gauge("Host", host.used if host else 0, host.total if host else None, 0.75, 0.9)

    def _gpu_lines(self) -> list[Text]:
        """One bar per GPU the daemon reports (used / total); none on a box without."""
        lines = []
        for gpu in self.snapshot.gpus:
            label = f"GPU {gpu.index}"
            if gpu.lost:
                text = Text(f"{label:<9}")
                text.append(f"lost: {gpu.name} {gpu.uuid}", style="bold red")
                lines.append(text)
                continue
            line = self._gauge(label, gpu.used_bytes or 0, gpu.total_bytes, 0.75, 0.9)
            line.append(f"  {gpu.name}", style="dim")
            lines.append(line)
        return lines

    def _limits(self) -> list[Headroom]:
        """The daemon's cgroup limits (``cgroup:PATH``), the fullest first."""
        limits = [h for h in self.snapshot.headroom if h.resource.startswith(Resource.CGROUP_PREFIX)]
        return sorted(limits, key=lambda h: (-(h.ratio if h.ratio is not None else float("inf")), h.resource))

    def _limit_lines(self) -> list[Text]:
        """Σ peaks against each cgroup limit's headroom, named (``docker web``): a container
        can run out of memory long before the box does."""
        limits = self._limits()
        lines = []
        for h in limits[:MAX_LIMITS]:
            line = self._gauge("Σ limit", h.sum_peaks_bytes, h.capacity_bytes, 0.9, 1.0)
            _seen_together(line, h)
            line.append(f"  {printable(h.name)}", style="dim")
            lines.append(line)
        if len(limits) > MAX_LIMITS:
            lines[-1].append(f"  +{len(limits) - MAX_LIMITS} more: memagent status", style="dim")
        return lines

    def _peaks_line(self) -> Text:
        """Σ peaks against the daemon's host headroom (share-adjusted, see docs/headroom.md);
        against total memory for a daemon that does not report headroom."""
        headroom = next((h for h in self.snapshot.headroom if h.resource == "host"), None)
        if headroom is not None:
            line = self._gauge("Σ peaks", headroom.sum_peaks_bytes, headroom.capacity_bytes, 0.9, 1.0)
            line.append(" of headroom", style="dim")
            _seen_together(line, headroom)
            return line
        host = self.snapshot.host
        return self._gauge("Σ peaks", self.snapshot.sum_peaks, host.total if host else None, 0.9, 1.0)


def _seen_together(line: Text, headroom: Headroom) -> None:
    """Beside Σ peaks (every peak at once, the worst case), the highest total the daemon saw
    together (a lower bound; docs/headroom.md, "Two bounds"); nothing from an older daemon."""
    seen = headroom.observed_sum_max_bytes
    if seen is not None:
        line.append(f" · seen together {format_size(seen, long=True)}", style="dim")
