"""memtop's life as a process: it needs a terminal, leaves without a traceback, and ends,
with its embedded agent and demo fleet, when its terminal goes away.

The terminals are real: a pseudo-terminal of our own (closed from the master side, as a
terminal emulator or sshd does) and tmux (a killed session). memtop is another process,
so its exit and its children's are awaited by polling them against a deadline.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from memtop.terminal import HANGUP_EXIT

pytestmark = pytest.mark.e2e  # every test here starts processes (tests/tiers.py)

ROOT = Path(__file__).resolve().parents[2]
#: Runs memtop on stdin's terminal made the controlling one (the child is a session
#: leader); argv[1] is "ignore" to start with SIGHUP ignored, as under nohup or a shell's
#: ``trap '' HUP``.
CTTY = ("import fcntl, os, signal, sys, termios\n"
        "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
        "if sys.argv[1] == 'ignore': signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'memtop.cli', *sys.argv[2:]])")


class PtyMemtop:
    """memtop on a pseudo-terminal of 100x30; a thread reads everything it writes."""

    def __init__(self, *args: str, sighup: str = "default", env: dict[str, str] | None = None) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        self.proc = subprocess.Popen([sys.executable, "-c", CTTY, sighup, *args], stdin=slave, stdout=slave,
                                     stderr=slave, start_new_session=True, env={**os.environ, **(env or {})})
        os.close(slave)
        self._output = bytearray()
        self._changed = threading.Condition()
        self._stop_r, self._stop_w = os.pipe()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        poller = select.poll()
        poller.register(self.master, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while not any(fd == self._stop_r for fd, _ in poller.poll()):
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: every process holding the terminal has closed it
                data = b""
            with self._changed:
                self._output += data
                self._changed.notify_all()
            if not data:
                return

    @property
    def output(self) -> str:
        with self._changed:
            return self._output.decode(errors="replace")

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: text.encode() in self._output, timeout):
                raise AssertionError(f"{text!r} never appeared; memtop wrote:\n{self._output[-3000:]!r}")

    def press(self, key: str) -> None:
        os.write(self.master, key.encode())

    def hang_up(self) -> None:
        """Close the master side: the terminal is gone (SIGHUP to its session, EOF, EIO)."""
        self._stop_reading()
        os.close(self.master)
        self.master = -1

    def _stop_reading(self) -> None:
        if self._stop_w >= 0:
            os.write(self._stop_w, b"x")
            self._reader.join(10)
            os.close(self._stop_r)
            os.close(self._stop_w)
            self._stop_r = self._stop_w = -1

    def finish(self) -> None:
        """memtop has exited (else it is killed): read what is left, close our side."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)  # returns at EIO: the last holder of the terminal closed it
        self._stop_reading()
        if self.master >= 0:
            os.close(self.master)
            self.master = -1


@pytest.fixture
def pty_memtop() -> Iterator[Callable[..., PtyMemtop]]:
    started: list[PtyMemtop] = []

    def start(*args: str, **kw: object) -> PtyMemtop:
        m = PtyMemtop(*args, **kw)  # type: ignore[arg-type]
        started.append(m)
        return m

    yield start
    for m in started:
        m.finish()


def wait_gone(processes: list[psutil.Process], timeout: float) -> float:
    """Seconds until none of ``processes`` runs (a zombie has ended); fails past ``timeout``."""
    start = time.monotonic()
    while True:
        running = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not running:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"still running after {timeout} s: {[p.cmdline() for p in running]}")
        time.sleep(0.02)


def memtop_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memtop.cli", *args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=20)


def test_refuses_to_start_without_a_terminal(tmp_path: Path) -> None:
    r = memtop_cli("--socket", str(tmp_path / "nobody.sock"))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "memtop: needs a terminal (stdin and stdout are not both one); "
        "for the same figures as text, use `memagent ls` or `memagent status`"]


def test_version_is_the_package_version() -> None:
    r = memtop_cli("--version")
    ours = subprocess.run([sys.executable, "-m", "memagent.cli", "--version"], capture_output=True, text=True,
                          timeout=20)
    assert r.returncode == 0 and ours.returncode == 0
    assert r.stdout.split() == ["memtop", ours.stdout.split()[1]]


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "abc", "1e9"])
def test_a_bad_interval_is_a_one_line_usage_error(value: str) -> None:
    """The embedded agent's interval: the daemon's range, refused before any screen opens."""
    r = memtop_cli("--interval", value)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("memtop: error: argument --interval:")


@pytest.mark.parametrize("args", [(), ("--demo",)], ids=["embedded", "demo"])
def test_quits_on_q_without_a_traceback(pty_memtop: Callable[..., PtyMemtop], tmp_path: Path,
                                        args: tuple[str, ...]) -> None:
    m = pty_memtop(*args, "--socket", str(tmp_path / "nobody.sock"), env={"TMPDIR": str(tmp_path)})
    m.wait_for("embedded agent")
    if "--demo" in args:  # sorted by name, the fleet's "demo-" rows come before any "python"
        m.press("N")
        m.wait_for("demo-steady")
    fleet = psutil.Process(m.proc.pid).children(recursive=True)
    m.press("q")
    assert m.proc.wait(15) == 0
    wait_gone(fleet, 5)
    m.finish()
    assert "Traceback" not in m.output and "CancelledError" not in m.output, m.output[-3000:]
    assert not list(tmp_path.glob("memtop-*"))  # the embedded agent's socket directory


@pytest.mark.parametrize("sighup", ["default", "ignore"])
def test_exits_when_its_terminal_is_closed(pty_memtop: Callable[..., PtyMemtop], tmp_path: Path,
                                           sighup: str) -> None:
    """With SIGHUP as it comes, or ignored (nohup, ``trap '' HUP``): EOF and EIO still tell."""
    m = pty_memtop("--socket", str(tmp_path / "nobody.sock"), "--interval", "0.2", sighup=sighup,
                   env={"TMPDIR": str(tmp_path)})
    m.wait_for("embedded agent")
    memtop = psutil.Process(m.proc.pid)
    m.hang_up()
    seconds = wait_gone([memtop], 3)
    assert m.proc.wait(1) == HANGUP_EXIT, f"exited after {seconds:.2f} s"
    assert not list(tmp_path.glob("memtop-*"))  # the embedded agent stopped, its socket removed


def _command(p: psutil.Process) -> str:
    """Its command line after the interpreter; "" once it is gone."""
    try:
        return " ".join(p.cmdline()[1:])
    except psutil.Error:
        return ""


def _tmux(server: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["tmux", "-L", server, *args], capture_output=True, text=True, timeout=10)


@pytest.mark.skipif(shutil.which("tmux") is None or shutil.which("make") is None,
                    reason="tmux or make is not installed")
@pytest.mark.skipif(not (Path(sys.prefix) / "bin" / "memtop").exists(), reason="memtop is not installed here")
def test_make_demo_ends_with_its_killed_tmux_session(tmp_path: Path) -> None:
    """``make demo`` in a tmux session that is killed: memtop and every demo-fleet process
    end. The shell ignores SIGHUP (``trap '' HUP``), so only the terminal's EOF tells."""
    server = f"memtop-life-{os.getpid()}"
    stamp = Path(sys.prefix) / ".installed"  # never reinstall the environment the tests run in
    command = f"trap '' HUP; exec make -C {ROOT} -o {stamp} VENV={sys.prefix} demo"
    memtop: list[psutil.Process] = []
    fleet: list[psutil.Process] = []
    try:
        r = _tmux(server, "new-session", "-d", "-s", "demo", "-x", "120", "-y", "30", command)
        assert r.returncode == 0, r.stderr
        make = psutil.Process(int(_tmux(server, "display-message", "-p", "-t", "demo", "#{pane_pid}").stdout))
        deadline = time.monotonic() + 60
        while True:  # memtop, its 5 members and the 3 workers the forked one forks (and py-spy)
            tree = [(_command(p), p) for p in make.children(recursive=True)]
            memtop = [p for cmd, p in tree if cmd == f"{sys.prefix}/bin/memtop --demo"]
            fleet = [p for cmd, p in tree if cmd.startswith("-m memagent.demo_fleet worker ")]
            if len(memtop) == 1 and len(fleet) == 8:
                break
            assert time.monotonic() < deadline, _tmux(server, "capture-pane", "-p", "-t", "demo").stdout
            time.sleep(0.2)
        _tmux(server, "kill-session", "-t", "demo")
        seconds = wait_gone(memtop, 3)
        wait_gone(fleet, 3)
        assert seconds < 3
    finally:
        _tmux(server, "kill-server")
        for p in memtop + fleet:  # a failure must not leave a headless demo behind
            with contextlib.suppress(psutil.Error):
                p.kill()


def test_a_demo_worker_dies_quietly_however_many_sigterms_it_gets() -> None:
    """Stopping the fleet and the death of the thread that started it (PR_SET_PDEATHSIG)
    both send SIGTERM: one landing in the interpreter's shutdown printed a traceback."""
    worker = subprocess.Popen([sys.executable, "-m", "memagent.demo_fleet", "worker", "steady"],
                              stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    process = psutil.Process(worker.pid)
    deadline = time.monotonic() + 20
    while process.memory_info().rss < 100 * 1024 * 1024:  # its 120 MiB held: the handler is set
        assert time.monotonic() < deadline and worker.poll() is None
        time.sleep(0.05)
    while worker.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGTERM)
        time.sleep(0.0005)
    _, err = worker.communicate(timeout=10)
    assert worker.returncode == 0 and err == ""
