"""Which agent memtop talks to, and that it stays with it: a daemon that restarts is
reconnected to (with backoff, said in the header), never replaced by an embedded agent."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from conftest import Daemon, Target
from test_memtop_pilot import table_pids, until

from memtop.app import MemtopApp
from memtop.link import BACKOFF_MAX
from memtop.widgets.header import MemHeader


def status_line(app: MemtopApp) -> str:
    return str(app.query_one(MemHeader).render().renderables[0])  # type: ignore[attr-defined]


async def test_memtop_follows_a_killed_and_restarted_daemon(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], sock_path: str
) -> None:
    """The default mode: connected to a daemon at start, so it stays with that daemon."""
    d = start_daemon("--interval", "0.1", socket=sock_path)
    before = make_target()
    with d.client() as c:
        c.attach([before.pid], label="before")
    app = MemtopApp(sock_path, embedded_interval=0.2)
    async with app.run_test(size=(160, 30)) as pilot:
        await until(pilot, lambda: app.link_state.connected and table_pids(app) == [before.pid])
        assert not app.link_state.embedded
        d.proc.kill()  # SIGKILL: its socket file stays behind, nobody answers on it
        d.proc.wait(10)
        await until(pilot, lambda: app.link_state.lost and app.link_state.attempt >= 3)
        assert not app.link_state.connected and app.embedded_agent is None
        line = status_line(app)
        assert f"● daemon lost — reconnecting (attempt {app.link_state.attempt})…" in line
        assert line.endswith(f"  no memagent daemon at {sock_path}")
        assert table_pids(app) == [before.pid]  # the last data stays on screen meanwhile
        after = make_target()
        d2 = start_daemon("--interval", "0.1", socket=sock_path)
        listening = time.monotonic()
        with d2.client() as c:
            c.attach([after.pid], label="after")
        await until(pilot, lambda: app.link_state.connected, timeout=10)
        assert time.monotonic() - listening < BACKOFF_MAX + 1.0
        assert not app.link_state.embedded and app.embedded_agent is None
        assert app.link_state.path == sock_path and not app.link_state.lost
        # The state is the restarted daemon's: its list, not the one memtop had.
        await until(pilot, lambda: table_pids(app) == [after.pid])


async def test_a_daemon_socket_nobody_answers_is_waited_on(start_daemon: Callable[..., Daemon],
                                                           sock_path: str) -> None:
    """A socket file at start is a daemon (re)starting: memtop waits for it, no embedded agent."""
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(sock_path)  # a daemon's socket left behind: the file, no listener
    stale.close()
    app = MemtopApp(sock_path, embedded_interval=0.2)
    async with app.run_test(size=(140, 30)) as pilot:
        await until(pilot, lambda: app.link_state.attempt >= 2)
        assert app.embedded_agent is None and not app.link_state.lost
        line = status_line(app)
        assert f"● disconnected — retrying (attempt {app.link_state.attempt})…" in line
        assert line.endswith(f"  no memagent daemon at {sock_path}")
        start_daemon("--interval", "0.1", socket=sock_path)
        await until(pilot, lambda: app.link_state.connected, timeout=10)
        assert not app.link_state.embedded and app.embedded_agent is None


async def test_embedded_always_runs_its_own_agent_beside_a_daemon(
    daemon: Daemon, make_target: Callable[..., Target]
) -> None:
    """``memtop --embedded``: its own agent although a daemon answers (which sees nothing of it)."""
    t = make_target()  # a Python process of ours: the embedded agent watches it
    app = MemtopApp(daemon.socket, embedded="always", embedded_interval=0.2)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.link_state.connected)
        embedded = app.embedded_agent
        assert app.link_state.embedded and embedded is not None
        assert app.link_state.path == embedded.socket != daemon.socket
        await until(pilot, lambda: t.pid in table_pids(app))
    assert not embedded.running
