"""memtop: the peak offenders among the watched processes, live.

The connection worker (:meth:`MemtopApp.run_link`, :class:`~memtop.link.Connector`) owns
the socket and only posts messages; the app applies every frame to
:class:`~memtop.model.FleetModel` through a map from frame type to handler, then sets the
immutable :class:`~memtop.model.Snapshot` reactive. The widgets are bound to the app's
reactives (``data_bind``) and compute their view from them: the app pushes data into
none of them. With no daemon socket at start (or with ``--embedded``), memtop starts an
embedded agent through :func:`memagent.embedded.start_embedded`, its one door into the
agent package; a daemon it was connected to is reconnected to, never replaced.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar, cast

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.reactive import reactive, var
from textual.widget import Widget
from textual.widgets import Footer, Input

from memproto.client_side import ConnectionLost
from memproto.frames import (
    Attach,
    AttachOk,
    Detach,
    DetachOk,
    Error,
    Frame,
    ResetPeaks,
    ResetPeaksOk,
    Stack,
    StackOk,
)
from memproto.paths import socket_candidates
from memproto.records import Failure
from memproto.vocabulary import StackState

from . import columns
from .link import Connector, EmbeddedMode
from .messages import FrameArrived, LinkDown, LinkUp
from .model import Detail, FleetModel, Key, Snapshot
from .screens import AttachScreen, HelpScreen, python_candidates
from .widgets.alerts import AlertBanner, AlertLogScreen
from .widgets.detail import DetailPane, RssPanel
from .widgets.header import LinkNotice, LinkState, MemHeader
from .widgets.stack import StackPanel
from .widgets.table import ProcessTable

if TYPE_CHECKING:
    from memagent.embedded import EmbeddedAgent

W = TypeVar("W", bound=Widget)
F = TypeVar("F", bound=Frame)
FrameHandler = Callable[[Frame], None]
#: Seconds between two stack requests for the selected process.
STACK_EVERY = 3.0


def _handles(kind: type[F], handler: Callable[[F], None]) -> tuple[type[Frame], FrameHandler]:
    """One entry of the frame dispatch map; the type checker sees that ``handler`` takes
    ``kind`` (the map itself can only say "some frame")."""
    return kind, cast(FrameHandler, handler)


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
        # Direct sort keys, from the column table; not in the footer, which has no room.
        *(Binding(key, f"sort_by('{c.key}')", f"Sort by {c.title}", show=False)
          for key, c in columns.HOTKEYS.items()),
    ]

    # ``var``: the widgets bound to these repaint themselves. A repaint of the app would
    # have the compositor render the whole screen on every update, not the changed parts.
    snapshot: var[Snapshot] = var(Snapshot, init=False)
    #: What the detail pane shows: follows the snapshot and the selection.
    detail: var[Detail] = var(Detail, init=False)
    link_state: reactive[LinkState] = reactive(LinkState, init=False)
    sort_column: reactive[str] = reactive(columns.DEFAULT_SORT, init=False)
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
        embedded: EmbeddedMode = "auto",
        demo: bool = False,
        embedded_interval: float = 0.5,
    ) -> None:
        super().__init__()
        self.connect = connect
        self.model = FleetModel()
        self._connector = Connector(socket_candidates(socket), self.post_message, allow_embedded=allow_embedded,
                                    embedded=embedded, demo=demo, embedded_interval=embedded_interval)
        self._ui_loop: asyncio.AbstractEventLoop | None = None
        self._stack_inflight: int | None = None
        self._handlers = self._frame_handlers()

    @property
    def embedded_agent(self) -> EmbeddedAgent | None:
        """The agent memtop started in-process because no daemon answered (None: none)."""
        return self._connector.embedded

    def _main(self, kind: type[W]) -> W:
        """A widget of the main screen, even while a modal screen (help, attach) is on top."""
        return self.screen_stack[0].query_one(kind)

    def compose(self) -> ComposeResult:
        # Bound here, in the app's compose: data_bind binds to the node composing the widget.
        yield MemHeader().data_bind(MemtopApp.snapshot, link=MemtopApp.link_state)
        yield LinkNotice().data_bind(link=MemtopApp.link_state)
        yield AlertBanner().data_bind(MemtopApp.snapshot)
        yield ProcessTable(id="table").data_bind(
            MemtopApp.snapshot, MemtopApp.sort_column, MemtopApp.sort_reverse, MemtopApp.filter_text,
            fallback_key=MemtopApp.selected_key,
        )
        with DetailPane().data_bind(shown=MemtopApp.show_detail):
            yield RssPanel().data_bind(MemtopApp.detail)
            yield StackPanel().data_bind(MemtopApp.detail)
        yield Input(placeholder="filter: PID, name, label or command line", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        # Everything built so far (Textual, widgets, styles) lives as long as the app: keep
        # it out of the cyclic GC's full passes, which otherwise stall an update now and then.
        gc.freeze()
        self._ui_loop = asyncio.get_running_loop()
        self._main(ProcessTable).focus()
        if self.connect:
            self.run_link()
            self.set_interval(STACK_EVERY, self._poll_stack)

    def on_unmount(self) -> None:
        self._connector.stop()

    def stop_agent(self) -> None:
        """Stop the embedded agent and its demo fleet now, from any thread (the terminal
        went away); the app's own exit then finds nothing left to stop."""
        self._connector.stop()

    def exit_from_thread(self, return_code: int) -> None:
        """Ask the app to exit from another thread, without waiting for it to happen."""
        loop = self._ui_loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(lambda: self.exit(return_code=return_code))

    @work(exclusive=True, group="link", exit_on_error=False)
    async def run_link(self) -> None:
        await self._connector.run()

    # ------------------------------------------------------------------ frames in

    def on_link_up(self, message: LinkUp) -> None:
        # The list, history and status the connector asks for on every link replace what
        # a previous daemon said; its count of dropped samples starts again too.
        self.model.dropped = 0
        self.link_state = LinkState(True, message.path, message.embedded, "", self.paused)

    def on_link_down(self, message: LinkDown) -> None:
        self._stack_inflight = None
        self.link_state = replace(self.link_state, connected=False, message=message.reason,
                                  attempt=message.attempt, lost=message.lost)

    def on_frame_arrived(self, message: FrameArrived) -> None:
        self.feed(message.frame)

    def feed(self, frame: Frame) -> None:
        """Apply one frame from the daemon (also used to replay recorded frames in tests)."""
        if not self.screen_stack:
            return  # shutting down: frames still in flight have nowhere to go
        if self.apply_frame(frame) and not self.paused:
            self.snapshot = self.model.snapshot()

    def apply_frame(self, frame: Frame) -> bool:
        """Apply ``frame`` to the model (:meth:`FleetModel.apply`, the table replay uses
        too), then do what the app does beyond it (say a failure, forget a request in
        flight); False for a frame type memtop has no use for, which changes nothing."""
        handled = self.model.apply(frame)
        handler = self._handlers.get(type(frame))
        if handler is not None:
            handler(frame)
            return True
        return handled

    def _frame_handlers(self) -> dict[type[Frame], FrameHandler]:
        """What some replies do beyond the model (which :meth:`FleetModel.apply` changes
        for every frame type), built once."""
        return dict([
            _handles(StackOk, self._stack_ok),
            _handles(AttachOk, lambda f: self._report(f.failed)),
            _handles(ResetPeaksOk, lambda f: self._report(f.failed)),
            _handles(DetachOk, lambda f: self._report(f.failed)),
            _handles(Error, self._error),
        ])

    def _stack_ok(self, frame: StackOk) -> None:
        self._stack_inflight = None

    def _error(self, frame: Error) -> None:
        if frame.id is not None and frame.id == self._stack_inflight:
            self._stack_inflight = None  # the selected process went away: nothing to say
            return
        self.notify(frame.message, title=frame.code, severity="error")

    def _report(self, failed: list[Failure]) -> None:
        for f in failed:
            self.notify(f.message, severity="error")

    # ------------------------------------------------------------------ state

    def watch_snapshot(self) -> None:
        self.detail = self.model.detail(self.snapshot, self.selected_key)

    def watch_paused(self, paused: bool) -> None:
        self.link_state = replace(self.link_state, paused=paused)
        if not paused:
            self.snapshot = self.model.snapshot()

    def watch_selected_key(self) -> None:
        self._stack_inflight = None
        self.detail = self.model.detail(self.snapshot, self.selected_key)
        self._poll_stack()

    def _poll_stack(self) -> None:
        """Ask for the selected process's stacks (a fresh dump, within the daemon's budget)."""
        row = self.snapshot.row(self.selected_key)
        if row is None or self._connector.link is None or self._stack_inflight is not None or not self.show_detail:
            return
        if row.stack_state in StackState.FINAL:
            return
        request_id = self._next_id()
        if self._send(Stack(request_id, row.pid, fresh=row.alive)):
            self._stack_inflight = request_id

    @on(ProcessTable.Highlighted)
    def highlighted(self, message: ProcessTable.Highlighted) -> None:
        self.selected_key = message.key

    @on(ProcessTable.SortClicked)
    def sort_clicked(self, message: ProcessTable.SortClicked) -> None:
        self.action_sort_by(message.column)

    # ------------------------------------------------------------------ actions

    def _send(self, frame: Frame) -> bool:
        link = self._connector.link
        if link is None:
            self.notify("not connected to a daemon", severity="warning")
            return False
        try:
            link.send(frame)
        except ConnectionLost:
            self.notify("not connected to a daemon", severity="warning")
            return False
        return True

    def _next_id(self) -> int:
        link = self._connector.link
        return link.next_id() if link else 0

    def action_toggle_detail(self) -> None:
        self.show_detail = not self.show_detail

    def action_cycle_sort(self) -> None:
        self.sort_reverse = False
        self.sort_column = columns.next_in_cycle(self.sort_column)

    def action_sort_by(self, column: str) -> None:
        """Sort by ``column`` in its natural direction; by the same column again: reversed."""
        if column not in columns.BY_KEY or not columns.BY_KEY[column].sortable:
            return
        if column == self.sort_column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_reverse = False
            self.sort_column = column

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
