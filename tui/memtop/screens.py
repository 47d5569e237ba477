"""Modal screens: help, and attach (type a PID or pick an unwatched Python process)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from .columns import HOTKEYS

HELP = [
    ("↑ ↓  j k", "move; the mouse works too (click a row, click a title to sort)"),
    ("PgUp PgDn Home End", "move faster"),
    ("Enter", "show / hide the detail pane of the selected process"),
    ("s", "cycle the sort column (click a title twice to reverse)"),
    (" ".join(HOTKEYS), "sort by " + ", ".join(c.title for c in HOTKEYS.values()) + " (again: reverse)"),
    ("/", "filter by PID, name, label or command line; Esc clears"),
    ("a", "attach: type a PID or pick an unwatched Python process"),
    ("d", "detach the selected process"),
    ("r", "reset the selected process's peak (starts a new peak window)"),
    ("p", "pause / resume the display (data keeps arriving)"),
    ("l", "the alert log: alerts firing now and recent ones"),
    ("?", "this help"),
    ("q", "quit"),
]


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        text = Text()
        text.append("memtop keys\n\n", style="bold")
        for key, what in HELP:
            text.append(f"{key:>20}  ", style="bold cyan")
            text.append(f"{what}\n")
        text.append("\nPEAK is the kernel's high-water mark (VmHWM) since start or reset; "
                    "'~' marks a sampled peak.\nΣ peaks: if every process peaked at once. "
                    "Exited processes keep their peak until detached.")
        yield Static(text, id="help-body")

    def on_click(self) -> None:
        self.dismiss(None)


@dataclass(frozen=True)
class Candidate:
    pid: int
    name: str
    cmdline: str


def python_candidates(watched: set[int]) -> list[Candidate]:
    """Python processes the user may watch and that are not watched yet."""
    me, root = os.getuid(), os.geteuid() == 0
    out = []
    for p in psutil.process_iter(["pid", "name", "cmdline", "uids"]):
        info = p.info
        if info["pid"] in watched or info["pid"] == os.getpid():
            continue
        if not root and (info["uids"] is None or info["uids"].real != me):
            continue
        name = info["name"] or ""
        cmd = info["cmdline"] or []
        if "python" in name or (cmd and "python" in os.path.basename(cmd[0])):
            out.append(Candidate(info["pid"], name, " ".join(cmd)))
    return out


class AttachScreen(ModalScreen[int | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, candidates: list[Candidate]) -> None:
        super().__init__()
        self.candidates = candidates

    def compose(self) -> ComposeResult:
        with Vertical(id="attach-box"):
            yield Label("Attach: type a PID and Enter, or pick a Python process below (Esc cancels)")
            yield Input(placeholder="PID", id="attach-pid", restrict=r"[0-9]*")
            options = [
                Option(Text(f"{c.pid:>7}  {c.name:<16} {c.cmdline}", no_wrap=True, overflow="ellipsis"), id=str(c.pid))
                for c in self.candidates
            ]
            yield OptionList(*options, id="attach-list")
            if not options:
                yield Label("no unwatched Python process of yours found", classes="dim")

    @on(Input.Submitted, "#attach-pid")
    def typed(self, event: Input.Submitted) -> None:
        if event.value.isdigit() and int(event.value) > 0:
            self.dismiss(int(event.value))

    @on(OptionList.OptionSelected, "#attach-list")
    def picked(self, event: OptionList.OptionSelected) -> None:
        if event.option.id is not None:
            self.dismiss(int(event.option.id))
