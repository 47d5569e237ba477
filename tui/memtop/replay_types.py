"""What the header says of a replay: :class:`ReplayState` and its status line.

Apart from :mod:`memtop.replay` because the header widget and the messages show it and
the replay app (a :class:`~memtop.app.MemtopApp`) makes it: kept in replay.py, each of them
imports replay and replay imports them, an import cycle (``tests/test_import_cycles.py``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from rich.text import Text

#: The speed's sign in the header (the multiplication sign).
TIMES = "\u00d7"


def local_time(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


@dataclass(frozen=True, slots=True)
class ReplayState:
    """What the header says of the replay."""

    source: str = ""
    host: str = ""
    clock: float = 0.0
    first: float = 0.0
    last: float = 0.0
    speed: float = 1.0
    paused: bool = False
    loading: bool = True
    #: Why the recording cannot be played ("" when it can).
    error: str = ""
    #: A seek being built in a thread (a long way from any checkpoint): where to
    #: (``math.inf``: the end, not known yet).
    seeking: float | None = None
    #: How much of the recording the index has read (0 to 1) while it reads; None once
    #: it has read it all (``last`` is then the recording's end).
    indexing: float | None = None

    @property
    def at_end(self) -> bool:
        return not self.loading and self.indexing is None and self.clock >= self.last

    def status(self) -> Text:
        """The header's status line's start: ``⏸ replay 2026-11-30 14:03:10 x8  host  …`` (a multiplication sign)."""
        if self.error:
            return Text(f"● replay of {self.source}: {self.error}", style="bold red")
        if self.loading:
            return Text(f"● replay: reading {self.source}…", style="yellow")
        text = Text()
        text.append("⏸ " if self.paused else "▶ ", style="bold yellow" if self.paused else "bold green")
        text.append("replay ", style="bold")
        text.append(local_time(self.clock), style="bold")
        text.append(f" {TIMES}{self.speed:g}")
        if self.at_end:
            text.append(" end", style="yellow")
        if self.seeking is not None:
            where = local_time(self.seeking) if math.isfinite(self.seeking) else "the end"
            text.append(f"  seeking {where}…", style="yellow")
        if self.indexing is not None:
            text.append(f"  reading {self.indexing:.0%}", style="dim")
        if self.host:
            text.append(f"  {self.host}")
        text.append("  no daemon", style="dim")
        return text
