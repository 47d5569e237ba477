"""memtop driven by Pilot against a real daemon watching real processes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from conftest import Daemon, MiB, Target
from textual.pilot import Pilot

from memtop.app import MemtopApp
from memtop.widgets.header import LinkState, MemHeader
from memtop.widgets.stack import StackPanel
from memtop.widgets.table import ProcessTable


async def until(pilot: Pilot[None], predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    """Let the app run until ``predicate`` holds (the app's state is the event we await)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await pilot.pause(0.05)


def table_pids(app: MemtopApp) -> list[int]:
    return [r.pid for r in app.query_one(ProcessTable).rows]


def make_fleet(daemon: Daemon, make_target: Callable[..., Target], sizes: dict[str, int]) -> dict[str, Target]:
    fleet = {}
    with daemon.client() as c:
        for label, mib in sizes.items():
            t = make_target()
            if mib:
                t.do(f"alloc {mib}")
            c.attach([t.pid], label=label)
            fleet[label] = t
    return fleet


async def test_highest_peak_first_sort_and_filter(daemon: Daemon, make_target: Callable[..., Target]) -> None:
    fleet = make_fleet(daemon, make_target, {"small": 0, "big": 120, "medium": 60})
    app = MemtopApp(daemon.socket, allow_embedded=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: len(table_pids(app)) == 3)
        assert table_pids(app)[0] == fleet["big"].pid
        assert [r.label for r in app.query_one(ProcessTable).rows] == ["big", "medium", "small"]
        # "s" cycles to RSS, then growth, share, PID (ascending).
        await pilot.press("s", "s", "s", "s")
        assert app.sort_column == "pid"
        assert table_pids(app) == sorted(table_pids(app))
        # Clicking a title sorts by it; clicking again reverses.
        await pilot.click(ProcessTable, offset=(3, 0))
        assert app.sort_column == "pid" and app.sort_reverse
        assert table_pids(app) == sorted(table_pids(app), reverse=True)
        # Filter by label.
        await pilot.press("slash", *"medi", "enter")
        await until(pilot, lambda: table_pids(app) == [fleet["medium"].pid])
        await pilot.press("escape")
        await until(pilot, lambda: len(table_pids(app)) == 3)


async def test_attach_detach_and_reset_from_the_ui(daemon: Daemon, make_target: Callable[..., Target]) -> None:
    fleet = make_fleet(daemon, make_target, {"first": 0})
    newcomer = make_target()
    app = MemtopApp(daemon.socket, allow_embedded=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: table_pids(app) == [fleet["first"].pid])
        await pilot.press("a")
        await pilot.press(*str(newcomer.pid), "enter")
        await until(pilot, lambda: newcomer.pid in table_pids(app))
        with daemon.client() as c:
            assert newcomer.pid in {p.pid for p in c.list()}
        # Select the newcomer, reset its peak after a spike, then detach it.
        newcomer.do("spike 80")
        table = app.query_one(ProcessTable)
        await until(pilot, lambda: any(r.pid == newcomer.pid and r.peak >= 80 * MiB for r in table.rows))
        table.cursor = table_pids(app).index(newcomer.pid)
        await pilot.press("r")
        await until(pilot, lambda: any(r.pid == newcomer.pid and r.peak < 60 * MiB for r in table.rows))
        await pilot.press("d")
        await until(pilot, lambda: newcomer.pid not in table_pids(app))
        with daemon.client() as c:
            assert {p.pid for p in c.list()} == {fleet["first"].pid}


async def test_disconnect_is_shown_and_clears_on_restart(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], sock_path: str
) -> None:
    d = start_daemon("--interval", "0.1", socket=sock_path)
    t = make_target()
    with d.client() as c:
        c.attach([t.pid])
    app = MemtopApp(sock_path, allow_embedded=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.link_state.connected and table_pids(app) == [t.pid])
        assert d.stop() == 0
        await until(pilot, lambda: not app.link_state.connected)
        header = app.query_one(MemHeader)
        assert "daemon lost — reconnecting" in str(header.render().renderables[0])  # type: ignore[attr-defined]
        assert table_pids(app) == [t.pid]  # the last data stays on screen
        d2 = start_daemon("--interval", "0.1", socket=sock_path)
        with d2.client() as c:
            c.attach([t.pid])
        await until(pilot, lambda: app.link_state.connected, timeout=20)
        await until(pilot, lambda: table_pids(app) == [t.pid])


async def test_embedded_agent_when_no_daemon(tmp_path: object, make_target: Callable[..., Target]) -> None:
    t = make_target()  # a Python process of ours: the embedded agent watches it
    app = MemtopApp(f"{tmp_path}/nobody.sock", embedded_interval=0.2)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.link_state.connected and app.link_state.embedded)
        await until(pilot, lambda: t.pid in table_pids(app))
        assert "embedded agent" in str(app.query_one(MemHeader).render().renderables[-1])  # type: ignore[attr-defined]
        embedded = app.embedded_agent
        assert embedded is not None and embedded.running
    assert not embedded.running  # stopped with the app


async def test_detail_pane_shows_the_selected_process_stack(
    daemon: Daemon, make_target: Callable[..., Target]
) -> None:
    fleet = make_fleet(daemon, make_target, {"py-model": 30})
    app = MemtopApp(daemon.socket, allow_embedded=False)
    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: table_pids(app) == [fleet["py-model"].pid])
        panel = app.query_one(StackPanel)
        await until(pilot, lambda: panel.reply is not None and panel.reply.latest is not None, timeout=20)
        assert panel.reply is not None and panel.reply.latest is not None
        names = [f.name for t in panel.reply.latest.threads for f in t.frames]
        assert "main" in names  # target_proc.py's main(), read from outside by py-spy
        await until(pilot, lambda: app.query_one(ProcessTable).rows[0].stack_state == "ok")


async def test_no_daemon_is_said_in_the_header(tmp_path: object) -> None:
    app = MemtopApp(f"{tmp_path}/nobody.sock", allow_embedded=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.link_state.message != LinkState().message)
        assert not app.link_state.connected and app.embedded_agent is None
        assert app.link_state.message == f"no memagent daemon at {tmp_path}/nobody.sock"
        status = str(app.query_one(MemHeader).render().renderables[0])  # type: ignore[attr-defined]
        assert "● disconnected — retrying (attempt " in status and app.link_state.message in status
