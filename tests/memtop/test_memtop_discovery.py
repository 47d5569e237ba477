"""memtop finds its daemon as every client does (issue 13): the first candidate path that
answers (the system socket, then the user's), at each try until one does; that daemon is
then the one followed across restarts, never replaced by an embedded agent nor by a daemon
on another candidate path. Real daemons; memtop's connection worker run in-process with
the candidate list given (so no test needs /run)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from conftest import Daemon
from textual.message import Message

from memproto.paths import SYSTEM_SOCKET, fallback_socket, socket_candidates
from memtop.link import Connector, EmbeddedMode
from memtop.messages import LinkDown, LinkUp

Queue = asyncio.Queue[Message]


@asynccontextmanager
async def connector(candidates: list[str], mode: EmbeddedMode = "auto") -> AsyncIterator[tuple[Connector, Queue]]:
    """The connection worker over ``candidates``, running; its messages in a queue."""
    queue: asyncio.Queue[Message] = asyncio.Queue()
    c = Connector(candidates, queue.put_nowait, embedded=mode, embedded_interval=0.2)
    task = asyncio.ensure_future(c.run())
    try:
        yield c, queue
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        c.stop()


async def next_of(queue: Queue, kind: type[Message], where: Callable[[Message], bool] = lambda m: True,
                  timeout: float = 15.0) -> Message:
    """The next message of ``kind`` that ``where`` accepts (others are passed over)."""
    async def wait() -> Message:
        while True:
            message = await queue.get()
            if isinstance(message, kind) and where(message):
                return message

    return await asyncio.wait_for(wait(), timeout)


def stale(path: str) -> str:
    """A daemon's socket file left behind: the file, no listener."""
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()
    return path


def test_candidates_put_the_system_socket_first_for_every_user() -> None:
    tmp = fallback_socket(1000)
    assert socket_candidates(None, {}, 1000) == (SYSTEM_SOCKET, tmp)
    assert socket_candidates(None, {"XDG_RUNTIME_DIR": "/run/user/1000"}, 1000) == (
        SYSTEM_SOCKET, "/run/user/1000/memagent.sock", tmp)
    assert socket_candidates(None, {"XDG_RUNTIME_DIR": "/run/user/0"}, 0) == (SYSTEM_SOCKET,)
    assert socket_candidates(None, {"MEMAGENT_SOCKET": "/e.sock"}, 1000) == ("/e.sock",)
    assert socket_candidates("/x.sock", {"MEMAGENT_SOCKET": "/e.sock"}, 1000) == ("/x.sock",)


async def test_default_mode_connects_to_the_first_candidate_that_answers(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """No socket file at the first path, a dead one at the second, a daemon at the third:
    memtop talks to that daemon and starts no embedded agent."""
    d = start_daemon("--interval", "0.2", socket=str(tmp_path / "user.sock"))
    candidates = [str(tmp_path / "system.sock"), stale(str(tmp_path / "runtime.sock")), d.socket]
    async with connector(candidates) as (c, queue):
        up = await next_of(queue, LinkUp)
        assert isinstance(up, LinkUp) and (up.path, up.embedded) == (d.socket, False)
        assert c.embedded is None and c.candidates == (d.socket,)


async def test_the_daemon_found_is_followed_across_restarts_not_replaced(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """Connected to the second candidate; it dies and a daemon starts on the first: memtop
    keeps trying the second only (a daemon's restart), and is back when it is."""
    first, second = str(tmp_path / "system.sock"), str(tmp_path / "user.sock")
    d = start_daemon("--interval", "0.2", socket=second)
    async with connector([first, second]) as (c, queue):
        await next_of(queue, LinkUp, lambda m: m.path == second)  # type: ignore[attr-defined]
        d.proc.kill()  # its socket file stays: a daemon restarting
        d.proc.wait(10)
        other = start_daemon("--interval", "0.2", socket=first)
        # Tries after the other daemon listens: still the dead one's path, no other.
        down = await next_of(queue, LinkDown, lambda m: m.attempt >= 2)  # type: ignore[attr-defined]
        assert isinstance(down, LinkDown) and down.reason == f"no memagent daemon at {second}"
        assert other.proc.poll() is None and c.embedded is None
        assert not any(isinstance(m, LinkUp) for m in drain(queue))
        start_daemon("--interval", "0.2", socket=second)
        up = await next_of(queue, LinkUp)
        assert isinstance(up, LinkUp) and (up.path, up.embedded) == (second, False)


async def test_no_embedded_waits_on_every_candidate_and_names_them(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """``--no-embedded`` with nothing anywhere: one reason naming each path; the first
    daemon to start on any of them is taken."""
    first, second = str(tmp_path / "system.sock"), str(tmp_path / "user.sock")
    async with connector([first, second], "never") as (c, queue):
        down = await next_of(queue, LinkDown)
        assert isinstance(down, LinkDown) and down.reason == f"no memagent daemon at {first} or {second}"
        start_daemon("--interval", "0.2", socket=second)
        up = await next_of(queue, LinkUp)
        assert isinstance(up, LinkUp) and up.path == second and c.embedded is None


async def test_a_candidate_that_cannot_be_connected_to_is_passed_over_and_named(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """A path that cannot be connected to (as one outside the socket's group; here, one too
    long for AF_UNIX) is passed over for the next; alone, it is the reason given."""
    d = start_daemon("--interval", "0.2", socket=str(tmp_path / "user.sock"))
    too_long = str(tmp_path / ("x" * 120) / "memagent.sock")
    async with connector([too_long, d.socket]) as (c, queue):
        up = await next_of(queue, LinkUp)
        assert isinstance(up, LinkUp) and up.path == d.socket and c.embedded is None
    async with connector([too_long]) as (c, queue):
        down = await next_of(queue, LinkDown)
        assert isinstance(down, LinkDown) and down.reason == f"cannot connect to {too_long}: AF_UNIX path too long"
        assert c.embedded is None


def drain(queue: Queue) -> list[Message]:
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out
