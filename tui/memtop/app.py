"""memtop: the peak offenders among the watched processes, live.

The connection worker (:meth:`MemtopApp.run_link`) owns the socket and only posts
messages; the app feeds every frame into :class:`~memtop.model.FleetModel` and sets the
immutable :class:`~memtop.model.Snapshot` reactive that the widgets render. With no
daemon on the socket, memtop starts an embedded agent through
:func:`memagent.embedded.start_embedded`, its one door into the agent package.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import sys
from dataclasses import replace
from typing import Any, TypeVar

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Footer, Input

from memproto import ProtocolError
from memproto.frames import (
    AlertRaised,
    Attach,
    Attached,
    AttachOk,
    Detach,
    Detached,
    DetachOk,
    Dropped,
    Error,
    Exited,
    Frame,
    History,
    HistoryOk,
    ListOk,
    ListProcesses,
    ResetPeaks,
    ResetPeaksOk,
    Sample,
    Stack,
    StackOk,
    StackStateChanged,
    Status,
    StatusOk,
    Subscribe,
)
from memproto.paths import socket_path

from .link import DaemonLink, LinkClosed, NoDaemon
from .messages import FrameArrived, LinkDown, LinkUp
from .model import SORTS, FleetModel, Key, Snapshot, sort_rows
from .screens import AttachScreen, HelpScreen, python_candidates
from .widgets.alerts import AlertBanner, AlertLogScreen
from .widgets.detail import DetailPane, RssPanel
from .widgets.header import LinkState, MemHeader
from .widgets.stack import StackPanel
from .widgets.table import ProcessTable

W = TypeVar("W", bound=Widget)
SORT_CYCLE = ("peak", "rss", "growth", "share", "pid", "name")
#: Seconds between two stack requests for the selected process.
STACK_EVERY = 3.0
#: Stack states in which asking again is pointless.
NO_STACK_STATES = {"not_python", "py_spy_missing", "disabled", "exited"}
STATUS_EVERY = 2.0
BACKOFF_MAX = 5.0


class MemtopApp(App[None]):
    CSS_PATH = "memtop.tcss"
    TITLE = "memtop"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("enter", "toggle_detail", "Details"),
        Binding("s", "cycle_sort", "Sort"),
        Binding("slash", "filter", "Filter"),
        Binding("a", "attach", "Attach"),
        Binding("d", "detach", "Detach"),
        Binding("r", "reset_peak", "Reset peak"),
        Binding("p", "pause", "Pause"),
        Binding("l", "alert_log", "Alerts"),
        Binding("question_mark", "help", "Help"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    snapshot: reactive[Snapshot] = reactive(Snapshot, init=False)
    link_state: reactive[LinkState] = reactive(LinkState, init=False)
    sort_column: reactive[str] = reactive("peak", init=False)
    sort_reverse: reactive[bool] = reactive(False, init=False)
    filter_text: reactive[str] = reactive("", init=False)
    paused: reactive[bool] = reactive(False, init=False)
    show_detail: reactive[bool] = reactive(True, init=False)
    selected_key: reactive[Key | None] = reactive(None, init=False)

    def __init__(
        self,
        socket: str | None = None,
        *,
        connect: bool = True,
        allow_embedded: bool = True,
        demo: bool = False,
        embedded_interval: float = 0.5,
    ) -> None:
        super().__init__()
        self.socket_path = socket_path(socket)
        self.connect = connect
        self.allow_embedded = allow_embedded
        self.demo = demo
        self.embedded_interval = embedded_interval
        self.model = FleetModel()
        self._link: DaemonLink | None = None
        self._embedded: Any = None
        self._stack_inflight: int | None = None

    def _main(self, kind: type[W]) -> W:
        """A widget of the main screen, even while a modal screen (help, attach) is on top:
        frames keep arriving and must land on the main screen's widgets."""
        return self.screen_stack[0].query_one(kind)

    def compose(self) -> ComposeResult:
        yield MemHeader()
        yield AlertBanner()
        yield ProcessTable(id="table")
        yield DetailPane()
        yield Input(placeholder="filter: PID, name, label or command line", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        # Everything built so far (Textual, widgets, styles) lives as long as the app: keep
        # it out of the cyclic GC's full passes, which otherwise stall an update now and then.
        gc.freeze()
        self._main(ProcessTable).focus()
        if self.connect:
            self.run_link()
            self.set_interval(STACK_EVERY, self._poll_stack)

    def on_unmount(self) -> None:
        if self._embedded is not None:
            self._embedded.stop()
            self._embedded = None

    # ------------------------------------------------------------------ connection worker

    @work(exclusive=True, group="link", exit_on_error=False)
    async def run_link(self) -> None:
        backoff = 0.5
        path = self.socket_path
        embedded = False
        if self.demo:
            path, embedded = await self._start_embedded(), True
        while True:
            link = DaemonLink(path)
            try:
                await link.open()
            except NoDaemon as exc:
                if self.allow_embedded and not embedded and self._embedded is None:
                    path, embedded = await self._start_embedded(), True
                    continue
                self.post_message(LinkDown(str(exc), backoff))
            except (OSError, LinkClosed, ProtocolError, asyncio.TimeoutError) as exc:
                self.post_message(LinkDown(str(exc) or type(exc).__name__, backoff))
            else:
                backoff = 0.5
                self._link = link
                self.post_message(LinkUp(path, embedded))
                await self._serve(link)
                self._link = None
                link.close()
                continue
            link.close()
            await asyncio.sleep(backoff)
            backoff = min(BACKOFF_MAX, backoff * 2)

    async def _start_embedded(self) -> str:
        from memagent.embedded import start_embedded

        self._embedded = await asyncio.to_thread(start_embedded, interval=self.embedded_interval, demo=self.demo)
        return str(self._embedded.socket)

    async def _serve(self, link: DaemonLink) -> None:
        """Ask for the current state, subscribe, then relay frames until the link drops."""
        for frame in (ListProcesses(link.next_id()), History(link.next_id()), Status(link.next_id()),
                      Subscribe(link.next_id())):
            link.send(frame)
        poller = asyncio.ensure_future(self._poll_status(link))
        try:
            while True:
                self.post_message(FrameArrived(await link.recv()))
        except (OSError, LinkClosed, ProtocolError) as exc:
            self.post_message(LinkDown(str(exc) or type(exc).__name__, 0.5))
        finally:
            poller.cancel()

    async def _poll_status(self, link: DaemonLink) -> None:
        with contextlib.suppress(LinkClosed, OSError):
            while True:
                await asyncio.sleep(STATUS_EVERY)
                link.send(Status(link.next_id()))

    # ------------------------------------------------------------------ messages in

    def on_link_up(self, message: LinkUp) -> None:
        self.link_state = LinkState(True, message.path, message.embedded, "", self.paused)

    def on_link_down(self, message: LinkDown) -> None:
        self._stack_inflight = None
        note = f"{message.reason}; retrying in {message.retry_in:g}s"
        self.link_state = replace(self.link_state, connected=False, message=note)

    def on_frame_arrived(self, message: FrameArrived) -> None:
        self.feed(message.frame)

    def feed(self, frame: Frame) -> None:
        """Apply one frame from the daemon (also used to replay recorded frames in tests)."""
        if not self.screen_stack:
            return  # shutting down: frames still in flight have nowhere to go
        model = self.model
        if isinstance(frame, Sample):
            model.apply_sample(frame)
        elif isinstance(frame, ListOk):
            model.set_processes(frame.processes)
        elif isinstance(frame, HistoryOk):
            model.apply_history(frame.step, frame.series)
        elif isinstance(frame, StatusOk):
            model.apply_status(frame.status)
        elif isinstance(frame, Attached):
            model.upsert(frame.process)
        elif isinstance(frame, Exited):
            model.mark_exited(frame.pid, frame.start_time, frame.rss_peak_bytes)
        elif isinstance(frame, Detached):
            model.remove(frame.pid, frame.start_time)
        elif isinstance(frame, Dropped):
            model.dropped = frame.count
        elif isinstance(frame, StackOk):
            self._stack_inflight = None
            model.apply_stack(frame)
        elif isinstance(frame, AlertRaised):
            model.apply_alert(frame.alert)
        elif isinstance(frame, StackStateChanged):
            model.apply_stack_state(frame.pid, frame.start_time, frame.state)
        elif isinstance(frame, AttachOk | ResetPeaksOk):
            for p in frame.attached if isinstance(frame, AttachOk) else frame.reset:
                model.upsert(p)
            self._report(frame.failed)
        elif isinstance(frame, DetachOk):
            for ref in frame.detached:
                model.remove(ref.pid, ref.start_time)
            self._report(frame.failed)
        elif isinstance(frame, Error):
            if frame.id is not None and frame.id == self._stack_inflight:
                self._stack_inflight = None  # the selected process went away: nothing to say
                return
            self.notify(frame.message, title=frame.code, severity="error")
        else:
            return
        if not self.paused:
            self.snapshot = model.snapshot()

    def _report(self, failed: list[Any]) -> None:
        for f in failed:
            self.notify(f.message, severity="error")

    # ------------------------------------------------------------------ rendering

    def watch_snapshot(self) -> None:
        self._render_table()
        self._main(MemHeader).snapshot = self.snapshot
        self._main(AlertBanner).alerts = self.snapshot.alerts
        self._render_detail()

    def _render_table(self) -> None:
        snap = self.snapshot
        rows = [r for r in snap.rows if r.matches(self.filter_text)] if self.filter_text else list(snap.rows)
        rows = sort_rows(rows, self.sort_column, self.sort_reverse)
        available = {key for key in ("vram", "vram_peak") if any(getattr(r, key) is not None for r in snap.rows)}
        if any(r.stack_state for r in snap.rows):
            available.add("stack")
        table = self._main(ProcessTable)
        table.sort_column, table.sort_reverse = self.sort_column, self.sort_reverse
        table.set_rows(rows, available, self.selected_key)

    def _render_detail(self) -> None:
        pane = self._main(RssPanel)
        row = self.snapshot.row(self.selected_key)
        pane.row = row
        pane.points = self.model.history(self.selected_key)
        pane.now = self.snapshot.time
        stack = self._main(StackPanel)
        stack.reply = self.model.stack_for(self.selected_key)
        stack.state = row.stack_state if row else None

    def watch_link_state(self) -> None:
        if not self.screen_stack:
            return
        self._main(MemHeader).link = self.link_state

    def watch_sort_column(self) -> None:
        self._render_table()

    def watch_sort_reverse(self) -> None:
        self._render_table()

    def watch_filter_text(self) -> None:
        self._render_table()

    def watch_paused(self, paused: bool) -> None:
        self.link_state = replace(self.link_state, paused=paused)
        if not paused:
            self.snapshot = self.model.snapshot()

    def watch_show_detail(self, show: bool) -> None:
        self._main(DetailPane).display = show

    def watch_selected_key(self) -> None:
        self._stack_inflight = None
        self._render_detail()
        self._poll_stack()

    def _poll_stack(self) -> None:
        """Ask for the selected process's stacks (a fresh dump, within the daemon's budget)."""
        row = self.snapshot.row(self.selected_key)
        if row is None or self._link is None or self._stack_inflight is not None or not self.show_detail:
            return
        if row.stack_state in NO_STACK_STATES:
            return
        request_id = self._next_id()
        if self._send(Stack(request_id, row.pid, fresh=row.alive)):
            self._stack_inflight = request_id

    @on(ProcessTable.Highlighted)
    def highlighted(self, message: ProcessTable.Highlighted) -> None:
        self.selected_key = message.key

    @on(ProcessTable.SortClicked)
    def sort_clicked(self, message: ProcessTable.SortClicked) -> None:
        if message.column not in SORTS:
            return
        if message.column == self.sort_column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_reverse = False
            self.sort_column = message.column

    # ------------------------------------------------------------------ actions

    def _send(self, frame: Frame) -> bool:
        if self._link is None:
            self.notify("not connected to a daemon", severity="warning")
            return False
        try:
            self._link.send(frame)
        except LinkClosed:
            self.notify("not connected to a daemon", severity="warning")
            return False
        return True

    def _next_id(self) -> int:
        return self._link.next_id() if self._link else 0

    def action_toggle_detail(self) -> None:
        self.show_detail = not self.show_detail

    def action_cycle_sort(self) -> None:
        i = SORT_CYCLE.index(self.sort_column) if self.sort_column in SORT_CYCLE else -1
        self.sort_reverse = False
        self.sort_column = SORT_CYCLE[(i + 1) % len(SORT_CYCLE)]

    def action_filter(self) -> None:
        box = self.screen_stack[0].query_one("#filter", Input)
        box.add_class("visible")
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.screen_stack[0].query_one("#filter", Input)
        box.value = ""
        box.remove_class("visible")
        self.filter_text = ""
        self._main(ProcessTable).focus()

    @on(Input.Changed, "#filter")
    def filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()

    @on(Input.Submitted, "#filter")
    def filter_done(self, event: Input.Submitted) -> None:
        if not event.value.strip():
            event.input.remove_class("visible")
        self._main(ProcessTable).focus()

    def action_pause(self) -> None:
        self.paused = not self.paused

    def action_alert_log(self) -> None:
        self.push_screen(AlertLogScreen(list(self.model.alerts.values()), list(self.model.recent_alerts)))

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_attach(self) -> None:
        watched = {r.pid for r in self.snapshot.rows if r.alive}
        self.push_screen(AttachScreen(python_candidates(watched)), self._attach_chosen)

    def _attach_chosen(self, pid: int | None) -> None:
        if pid is not None and self._send(Attach(self._next_id(), [pid])):
            self.notify(f"attaching {pid}")

    def action_detach(self) -> None:
        row = self._main(ProcessTable).selected
        if row is not None and self._send(Detach(self._next_id(), [row.pid])):
            self.notify(f"detached {row.pid} ({row.display_name})")

    def action_reset_peak(self) -> None:
        row = self._main(ProcessTable).selected
        if row is not None and row.alive and self._send(ResetPeaks(self._next_id(), [row.pid])):
            self.notify(f"peak of {row.pid} reset")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memtop", description="The peak memory offenders on this box, live.")
    parser.add_argument("--socket", metavar="PATH", help="daemon socket (same resolution as memagent)")
    parser.add_argument("--no-embedded", action="store_true",
                        help="never start an embedded agent; wait for a daemon instead")
    parser.add_argument("--demo", action="store_true", help="start a demo fleet under an embedded agent")
    parser.add_argument("--interval", type=float, default=0.5, help="embedded agent's sample interval (0.5)")
    return parser


def entry(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    # An embedded agent logs like the daemon; on a full-screen terminal those lines would
    # tear the display. What it reports (alerts, states) is on the screen anyway.
    agent_log = logging.getLogger("memagent")
    agent_log.addHandler(logging.NullHandler())
    agent_log.propagate = False
    app = MemtopApp(args.socket, allow_embedded=not args.no_embedded, demo=args.demo,
                    embedded_interval=args.interval)
    app.run()
    sys.exit(app.return_code or 0)


if __name__ == "__main__":
    entry()
