"""memtop in a real terminal: tmux runs it, capture-pane reads the screen."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from conftest import Daemon, Target

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


@pytest.fixture
def tmux(tmp_path: object) -> Iterator[Callable[..., subprocess.CompletedProcess[str]]]:
    server = f"memtop-test-{id(tmp_path)}"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["tmux", "-L", server, *args], capture_output=True, text=True, timeout=10)

    yield run
    run("kill-server")


def wait_screen(tmux: Callable[..., subprocess.CompletedProcess[str]], needle: str, timeout: float = 30) -> str:
    """The terminal is outside our process: reading it again is the only way to wait."""
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = tmux("capture-pane", "-p", "-t", "memtop").stdout
        if needle in screen:
            return screen
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} never appeared on screen:\n{screen}")


def test_memtop_in_tmux_shows_a_watched_pid(
    daemon: Daemon, make_target: Callable[..., Target], tmux: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    t = make_target()
    with daemon.client() as c:
        c.attach([t.pid], label="tmux-model")
    command = f"{sys.executable} -m memtop.cli --socket {daemon.socket} --no-embedded"
    r = tmux("new-session", "-d", "-s", "memtop", "-x", "100", "-y", "30", command)
    assert r.returncode == 0, r.stderr
    screen = wait_screen(tmux, "tmux-model")
    row = next(line for line in screen.splitlines() if "tmux-model" in line)
    assert str(t.pid) in row
    assert daemon.socket in screen  # the header names the daemon it is connected to
    tmux("send-keys", "-t", "memtop", "q")
    deadline = time.monotonic() + 15
    while tmux("has-session", "-t", "memtop").returncode == 0:
        assert time.monotonic() < deadline, "memtop did not quit on q"
        time.sleep(0.2)
