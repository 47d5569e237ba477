"""``memtop --replay FILE|DIR``: the live screens, driven by a recording instead of a daemon.

:class:`ReplayApp` is :class:`~memtop.app.MemtopApp` with another source: instead of the
connection worker, the replay worker (:meth:`ReplayApp.run_replay`, :class:`Replayer`)
reads the recording (:mod:`memtop.replay_data`) and moves its clock: at speed s it waits
(t_next - t_now)/s between frames, crosses a gap of more than :data:`MAX_GAP` recorded
seconds (the daemon was stopped) in :data:`GAP_WALL` s and says so, and seeks on request.
Like the connection worker it only posts messages (:class:`~memtop.messages.ReplayMoved`:
the model of the moment and a snapshot of it); the widgets are the live ones, bound to the
same reactives. The header shows the recorded time, the speed, the host and that no
daemon is there; requests that need one (attach, detach, reset peaks) are refused in one
line. The keys are the live ones plus :data:`ReplayApp.BINDINGS`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Input

from memproto.recording import RecordingError
from memproto.text import printable

from .app import MemtopApp
from .messages import ReplayMoved, ReplayNote
from .replay_data import IN_PLACE_SECONDS, SPEED_MAX, SPEED_MIN, ReplayEngine, Span
from .replay_types import ReplayState, local_time
from .widgets.header import LinkState, MemHeader

#: A longer stretch of recorded seconds without a frame is a gap (the daemon was stopped):
#: crossed in GAP_WALL seconds whatever the speed, and said.
MAX_GAP = 10.0
GAP_WALL = 1.0
#: Fewest wall seconds between two updates of the screen (at most 20 a second at 64x).
MIN_STEP = 0.05
#: Most wall seconds without an update of the time shown (it moves through a gap too).
MAX_STEP = 0.5
#: Damage lines shown one by one; the rest are counted.
DAMAGE_SHOWN = 3


def clamp_speed(speed: float) -> float:
    return min(SPEED_MAX, max(SPEED_MIN, speed))


def span(seconds: float) -> str:
    """A duration for people: ``45 s``, ``12 min``, ``3 h 05 min``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60:02d} min"


class Replayer:
    """The replay worker: opens the recording, shows its first moment, then moves its clock
    and posts what a live memtop would have shown at each moment, while the index
    (:class:`~memtop.replay_data.Index`, in a thread) reads the rest. The app's keys call
    its controls (on the UI loop); each wakes the worker, which applies them between two
    steps."""

    def __init__(self, source: str, post: Callable[[Message], object], *, speed: float = 1.0,
                 paused: bool = False, since: float | None = None, until: float | None = None) -> None:
        self.source = source
        self.since, self.until = since, until
        self.post = post
        self.speed = clamp_speed(speed)
        self.paused = paused
        self.engine: ReplayEngine | None = None
        self.error = ""
        #: A seek asked for and not done yet; the one being done.
        self._seek: float | None = None
        self._seeking: float | None = None
        self._wake = asyncio.Event()
        self._stopped = False
        #: Damage lines of the index's already posted; whether its end was said.
        self._told = 0
        self._index_said = False

    def stop(self) -> None:
        """memtop quits: the index and a build under way in a thread end early."""
        self._stopped = True
        if self.engine is not None:
            self.engine.close()

    @property
    def state(self) -> ReplayState:
        engine = self.engine
        if engine is None:
            return ReplayState(self.source, speed=self.speed, paused=self.paused, error=self.error)
        index = engine.index
        return ReplayState(self.source, engine.span.host, engine.clock, engine.first, engine.last, self.speed,
                           self.paused, False, seeking=self._seeking,
                           indexing=None if index.done else index.progress)

    # ------------------------------------------------------------------ controls (UI loop)

    def toggle_pause(self) -> None:
        """Pause, or play on; at the end, play again from the start."""
        engine = self.engine
        if self.paused and engine is not None and self._seek is None and engine.at_end:
            self._seek = engine.first
        self.paused = not self.paused
        self._wake.set()

    def change_speed(self, factor: float) -> None:
        self.speed = clamp_speed(self.speed * factor)
        self._wake.set()

    def seek_by(self, seconds: float) -> None:
        """Seek from where the last seek asked for (keys pressed in a row add up)."""
        engine = self.engine
        if engine is None:
            return
        base = self._seek if self._seek is not None else self._seeking if self._seeking is not None else engine.clock
        self.seek_to(base + seconds)

    def seek_to(self, t: float) -> None:
        """Seek to ``t`` (``math.inf``: the end, wherever the index finds it)."""
        engine = self.engine
        if engine is not None:
            self._seek = engine.clamp(t)
            self._wake.set()

    # ------------------------------------------------------------------ the worker

    async def run(self) -> None:
        try:
            span = Span.open(self.source, self.since, self.until)
            self.engine = engine = ReplayEngine(span)
        except (RecordingError, OSError) as exc:
            self.error = str(exc) if isinstance(exc, RecordingError) else exc.strerror or str(exc)
            self.post(ReplayNote(f"cannot replay {self.source}: {self.error}", "error"))
            self._publish(False)
            return
        # What a client is told at once (the list, the headroom); with --since, all that
        # comes before it in its segment: in a thread, the screen saying it reads meanwhile.
        await asyncio.to_thread(engine.advance, engine.first)
        if engine.at_end and self.since is not None and engine.previous_time < self.since:
            self.post(ReplayNote(f"nothing recorded after --since {local_time(self.since)}: the recording ends at "
                                 f"{local_time(engine.previous_time)}", "warning"))
        self._publish(True)
        loop = asyncio.get_running_loop()

        def read_on() -> None:  # the index's thread: wake the worker (the header says how far)
            loop.call_soon_threadsafe(self._wake.set)

        index = asyncio.ensure_future(asyncio.to_thread(engine.index.run, read_on))
        try:
            await self._play(engine)
        finally:
            engine.close()  # the index's thread ends within STOP_CHECK frames
            index.cancel()

    async def _play(self, engine: ReplayEngine) -> None:
        while not self._stopped:
            self._tell_index(engine)
            if self._seek is not None:
                await self._do_seek(engine)
            elif self.paused or engine.at_end:
                if not self.paused:  # the end: hold it
                    self.paused = True
                self._publish(False)
                self._wake.clear()
                await self._wake.wait()
            else:
                await self._step(engine)

    def _tell_index(self, engine: ReplayEngine) -> None:
        """The index's damage as it finds it (the first few, then a count once it is done),
        and that the recording holds no samples."""
        index = engine.index
        damage = index.damage
        while self._told < min(len(damage), DAMAGE_SHOWN):
            self.post(ReplayNote(damage[self._told], "warning"))
            self._told += 1
        if index.done and not self._index_said:
            self._index_said = True
            if len(damage) > DAMAGE_SHOWN:
                self.post(ReplayNote(f"and {len(damage) - DAMAGE_SHOWN} more damaged parts skipped", "warning"))
            if not index.samples:
                self.post(ReplayNote("the recording holds no samples", "warning"))

    async def _step(self, engine: ReplayEngine) -> None:
        """Wait for the next frame (or a control), then move the clock as far as the wall
        time waited allows at the speed: every frame had by then is applied."""
        clock, nxt = engine.clock, engine.next_time
        gap = nxt - engine.previous_time
        rate = self.speed if gap <= MAX_GAP else max(self.speed, gap / GAP_WALL)
        due = (nxt - clock) / rate
        wait = min(max(due, MIN_STEP), MAX_STEP)
        loop = asyncio.get_running_loop()
        self._wake.clear()
        started = loop.time()
        woken = await _wait(self._wake, wait)
        target = clock + (loop.time() - started) * rate
        if not woken and due <= wait:
            target = max(target, nxt)  # the wait was for this frame: a late timer does not skip it
        target = engine.clamp(target)
        applied = engine.advance(target)
        if applied and rate > self.speed:
            self.post(ReplayNote(f"no data for {span(gap)} ({local_time(nxt - gap)} to {local_time(nxt)}): "
                                 f"crossed in {GAP_WALL:g} s"))
        self._publish(applied > 0)

    async def _do_seek(self, engine: ReplayEngine) -> None:
        """Show the moment asked for: forward in place when it is near, else a model rebuilt
        from a checkpoint (in a thread when the way is long; the screen stays meanwhile)."""
        assert self._seek is not None
        target, self._seek = self._seek, None
        self._seeking = target
        try:
            if not await self._index_passed(engine, target):
                return  # another seek was asked for meanwhile: that one is done next
            base, long_way = engine.plan(target)
            if base is engine.head:
                engine.advance(target)
            else:
                if long_way:
                    self._publish(False)  # says it seeks; the screen stays meanwhile
                    head = await asyncio.to_thread(engine.build, base, target)
                else:
                    head = engine.build(base, target)
                if self._stopped:
                    return
                engine.install(head, target)
        finally:
            self._seeking = None
        self._publish(True)

    async def _index_passed(self, engine: ReplayEngine, target: float) -> bool:
        """Wait, when ``target`` is a long way ahead of the moment shown, for the index to
        read past it (it is on its way there; reading the same frames twice at once would
        take both twice as long): then its checkpoint is the nearest. False when another
        seek is asked for meanwhile, or memtop quits."""
        index = engine.index
        if target <= engine.clock + IN_PLACE_SECONDS:
            return True
        while not index.done and index.last < target:
            self._publish(False)  # says it seeks, and how far the index has read
            self._wake.clear()
            await _wait(self._wake, MAX_STEP)
            if self._seek is not None or self._stopped:
                return False
        return True

    def _publish(self, changed: bool) -> None:
        engine = self.engine
        if engine is None:
            self.post(ReplayMoved(self.state, None, None))
            return
        self.post(ReplayMoved(self.state, engine.model, engine.model.snapshot() if changed else None))


async def _wait(event: asyncio.Event, seconds: float) -> bool:
    """Whether ``event`` was set within ``seconds``."""
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return False
    return True


class ReplayApp(MemtopApp):
    """memtop on a recording: the live screens, the replay worker as their source."""

    # Textual finds a relative stylesheet beside the module of the app's own class: a
    # subclass elsewhere (tests) would not find memtop's.
    CSS_PATH = str(Path(__file__).with_name("memtop.tcss"))
    BINDINGS = [
        Binding("space", "replay_pause", "Play/pause", key_display="␣", priority=True),
        Binding("plus,right_square_bracket", "replay_speed(2)", "Faster", key_display="+", priority=True),
        Binding("minus,left_square_bracket", "replay_speed(0.5)", "Slower", key_display="-", priority=True),
        Binding("left", "replay_seek(-10)", "-10s", key_display="←", priority=True),
        Binding("right", "replay_seek(10)", "+10s", key_display="→", priority=True),
        Binding("shift+left", "replay_seek(-60)", "-1 min", show=False, priority=True),
        Binding("shift+right", "replay_seek(60)", "+1 min", show=False, priority=True),
        Binding("pageup", "replay_seek(-300)", "-5 min", show=False, priority=True),
        Binding("pagedown", "replay_seek(300)", "+5 min", show=False, priority=True),
        Binding("home", "replay_jump('start')", "Start", show=False, priority=True),
        Binding("end", "replay_jump('end')", "End", show=False, priority=True),
        # The live requests are refused in one line: off the footer, which needs the room.
        Binding("a", "attach", "Attach", show=False),
        Binding("d", "detach", "Detach", show=False),
        Binding("r", "reset_peak", "Reset peak", show=False),
        Binding("p", "replay_pause", "Pause", show=False),
    ]

    replay: reactive[ReplayState] = reactive(ReplayState, init=False)

    def __init__(self, source: str, *, speed: float = 1.0, paused: bool = False, since: float | None = None,
                 until: float | None = None) -> None:
        super().__init__(connect=False)
        self.replayer = Replayer(source, self.post_message, speed=speed, paused=paused, since=since, until=until)

    def compose(self) -> ComposeResult:
        """The live screen's widgets, the header bound to the replay's state as well."""
        widgets: Iterator[Widget] = iter(super().compose())
        for widget in widgets:
            if isinstance(widget, MemHeader):
                widget.data_bind(replay=ReplayApp.replay)
            yield widget

    def on_mount(self) -> None:
        # MemtopApp.on_mount runs too (Textual calls each class's); it starts no link here.
        self.replay = self.replayer.state
        self.link_state = LinkState(True, self.replayer.source, False, "")
        self.run_replay()

    def on_unmount(self) -> None:
        self.replayer.stop()  # MemtopApp.on_unmount runs too

    @work(exclusive=True, group="replay")
    async def run_replay(self) -> None:
        await self.replayer.run()

    def on_replay_moved(self, message: ReplayMoved) -> None:
        if message.model is not None and message.model is not self.model:
            self.model = message.model  # a seek rebuilt it: the detail pane reads this one
        self.replay = message.state
        if message.snapshot is not None:
            self.snapshot = message.snapshot

    def on_replay_note(self, message: ReplayNote) -> None:
        # Plain text: a note names files, whose names are anyone's (a "[" is no markup here).
        self.notify(printable(message.text), severity=message.severity, markup=False)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The replay keys act on the main screen only, and not while the filter is typed
        in (space, arrows and Home/End are the input's there)."""
        if action.startswith("replay_"):
            return len(self.screen_stack) == 1 and not isinstance(self.focused, Input)
        return True

    # ------------------------------------------------------------------ actions

    def action_replay_pause(self) -> None:
        """Space, and p (which live freezes the display while data still comes)."""
        self.replayer.toggle_pause()
        self.replay = self.replayer.state

    def action_replay_speed(self, factor: float) -> None:
        self.replayer.change_speed(factor)
        self.replay = self.replayer.state

    def action_replay_seek(self, seconds: float) -> None:
        self.replayer.seek_by(seconds)

    def action_replay_jump(self, where: str) -> None:
        engine = self.replayer.engine
        if engine is not None:
            self.replayer.seek_to(engine.first if where == "start" else math.inf)

    def _no_daemon(self, what: str) -> None:
        self.notify(f"{what} needs a live daemon: this is a recording", severity="warning")

    def action_attach(self) -> None:
        self._no_daemon("attach")

    def action_detach(self) -> None:
        self._no_daemon("detach")

    def action_reset_peak(self) -> None:
        self._no_daemon("reset peak")
