"""Alerts in memtop: a banner under the header while any fires, and the alert log.

Alert messages name processes and labels: data, so plain ``Text``, never markup.
"""

from __future__ import annotations

import time

from rich.console import RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.reactive import reactive, var
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Static

from memproto.records import Alert
from memproto.vocabulary import AlertState, Severity

from ..model import Snapshot


def _by_severity(a: Alert) -> tuple[int, float]:
    """Most severe first, then newest first."""
    return (Severity.RANK.get(a.severity, len(Severity.RANK)), -a.time)


def alert_style(alert: Alert) -> str:
    if alert.state == AlertState.RESOLVED:
        return "green"
    return "bold red" if alert.severity == Severity.CRITICAL else "bold yellow"


class AlertBanner(Widget):
    """The most severe firing alert, and how many more fire; hidden when none does."""

    #: Bound to the app's; repaints only when the firing alerts change (:attr:`alerts`).
    snapshot: var[Snapshot] = var(Snapshot)
    alerts: reactive[tuple[Alert, ...]] = reactive(tuple)

    def watch_snapshot(self, snapshot: Snapshot) -> None:
        self.alerts = snapshot.alerts

    def watch_alerts(self, alerts: tuple[Alert, ...]) -> None:
        self.display = bool(alerts)

    def render(self) -> RenderableType:
        if not self.alerts:
            return Text("")
        worst = min(self.alerts, key=_by_severity)
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f" {worst.severity.upper()} {worst.kind} ", style="reverse " + alert_style(worst))
        text.append(" " + worst.message, style=alert_style(worst))
        more = len(self.alerts) - 1
        if more:
            text.append(f"  (+{more} more: l for the alert log)", style="dim")
        return text


def log_lines(active: list[Alert], recent: list[Alert]) -> Text:
    text = Text()
    text.append("Alerts firing now\n", style="bold")
    if not active:
        text.append("  none\n", style="dim")
    for a in sorted(active, key=_by_severity):
        text.append(_line(a))
    text.append("\nRecent (ended or one-off)\n", style="bold")
    if not recent:
        text.append("  none\n", style="dim")
    for a in recent[:50]:
        text.append(_line(a))
    return text


def _line(a: Alert) -> Text:
    when = time.strftime("%H:%M:%S", time.localtime(a.time))
    line = Text(f"  {when} ")
    line.append(f"{a.state:<8} {a.severity:<8} {a.kind:<9}", style=alert_style(a))
    line.append(f" {a.resource}: {a.message}\n")
    if a.details:
        line.append("      " + a.details.replace("\n", "\n      ") + "\n", style="dim")
    return line


class AlertLogScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,l,q", "dismiss", "Close")]

    def __init__(self, active: list[Alert], recent: list[Alert]) -> None:
        super().__init__()
        self.active = active
        self.recent = recent

    def compose(self) -> ComposeResult:
        yield Static(log_lines(self.active, self.recent), id="alert-log")
