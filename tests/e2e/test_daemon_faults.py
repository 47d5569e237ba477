"""Faults keep the rest working (issue 12): a broken /proc file, a request with a value
nobody expected, a daemon killed outright or its socket file deleted must cost what they
touch, not the daemon's alerts, its connections, its children's lifetime or the rule of
one daemon per socket.

Real daemons, real processes and sockets; the agent on a fixture /proc tree
(``ProcFS(root=...)``, the daemon has no option for it) where the kernel's contents must
be broken."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import select
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import pytest
from conftest import Daemon, Target, poll
from proctree import TRAINER, MiB, ProcTree

from memagent.agent import Agent
from memagent.client import Client
from memagent.config import AgentConfig, StackConfig
from memproto import decode, encode, frame_bytes
from memproto.client_side import client_hello
from memproto.frames import AlertRaised, Error, Frame, Hello, Stack, StatusOk
from memproto.framing import FrameBuffer

# --------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def agent_on(tree: ProcTree, socket_path: str) -> Iterator[Agent]:
    """A real :class:`Agent` over the fixture tree, serving ``socket_path`` from a thread
    of its own (as the embedded agent does); stopped and joined on the way out."""
    config = AgentConfig(socket=socket_path, interval=0.05, gpu=False, netlink=False,
                         stacks=StackConfig(enabled=False))
    agent = Agent(config, procfs=tree.procfs())
    started = threading.Event()
    failed: list[BaseException] = []
    loop: list[asyncio.AbstractEventLoop] = []
    stop: list[asyncio.Event] = []

    async def main() -> None:
        loop.append(asyncio.get_running_loop())
        stop.append(asyncio.Event())
        ready = asyncio.Event()
        serving = asyncio.ensure_future(agent.run(stop[0], ready))
        waiting = asyncio.ensure_future(ready.wait())
        await asyncio.wait([serving, waiting], return_when=asyncio.FIRST_COMPLETED)
        started.set()
        await serving

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            failed.append(exc)
            started.set()

    thread = threading.Thread(target=run, name="agent-on-tree", daemon=True)
    thread.start()
    assert started.wait(15), "the agent did not start"
    if failed:
        raise failed[0]
    try:
        yield agent
    finally:
        loop[0].call_soon_threadsafe(stop[0].set)
        thread.join(15)


class RawClient:
    """A client that has said hello and sends frames as bytes, unchecked by memproto."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(path)
        self.sock.sendall(frame_bytes(encode(client_hello("raw"))))
        self._buffer = FrameBuffer()
        self._frames: list[Frame] = []
        assert isinstance(self.recv(), Hello)

    def send(self, body: dict[str, object]) -> None:
        self.sock.sendall(frame_bytes(msgpack.packb({"v": 1, **body})))

    def recv(self) -> Frame:
        """The next frame; ConnectionError at end of stream (the daemon closed it)."""
        while not self._frames:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the daemon closed the connection")
            self._frames += [decode(p) for p in self._buffer.feed(data)]
        return self._frames.pop(0)

    def reply(self, request_id: int) -> Frame:
        """The frame that answers ``request_id`` (events in between skipped)."""
        while True:
            frame = self.recv()
            if getattr(frame, "id", None) == request_id:
                return frame

    def close(self) -> None:
        self.sock.close()


# --------------------------------------------------------------------------- 1. a garbage /proc/meminfo


def test_garbage_meminfo_keeps_alerts_and_status_working_on_the_last_good_reading(
        proc_tree: ProcTree, tmp_path: Path) -> None:
    """meminfo turns to garbage while the agent runs: the tick goes on with the last good
    reading, so a headroom crossing afterwards still raises its alert, and ``status``
    answers with that reading and says what is wrong in ``faults``."""
    proc_tree.set_meminfo(total=1000 * MiB, available=900 * MiB)
    proc_tree.set_memory(TRAINER, 100 * MiB)
    proc_tree.set_smaps_rollup(TRAINER, 100 * MiB, 100 * MiB)  # nothing shared: PSS known at once
    with agent_on(proc_tree, str(tmp_path / "a.sock")) as agent, Client(agent.config.socket, timeout=10) as c:
        c.attach([TRAINER])
        good = c.status()
        assert good.faults == [] and good.host.total_bytes == 1000 * MiB
        (proc_tree.root / "meminfo").write_bytes(b"MemTotal: \xff\xfe garbage kB\nMemAvailable: lots\n")
        # Σ peaks 700 MiB or more of a 1000 - 256 (reserve) MiB headroom: past the 90 % warning.
        proc_tree.set_memory(TRAINER, 700 * MiB)
        proc_tree.set_smaps_rollup(TRAINER, 700 * MiB, 700 * MiB)
        c.subscribe()
        alert = None
        for n, frame in enumerate(c.stream()):
            if isinstance(frame, AlertRaised) and frame.alert.kind == "headroom":
                alert = frame.alert
                break
            assert n < 400, "no headroom alert while /proc/meminfo is garbage"
        assert (alert.resource, alert.state) == ("host", "firing")
        status = c.status()
        assert status.host.total_bytes == 1000 * MiB and status.host.available_bytes == 900 * MiB
        (fault,) = status.faults
        assert "meminfo unreadable" in fault and "last good reading" in fault and "\n" not in fault
        # Readable again: the fault goes, the new reading counts.
        (proc_tree.root / "meminfo").write_text(f"MemTotal: {2000 * 1024} kB\nMemAvailable: {1500 * 1024} kB\n")
        again = c.status()
        assert again.faults == [] and again.host.total_bytes == 2000 * MiB


# --------------------------------------------------------------------------- 3. py-spy and a SIGKILLed daemon


def _read_pid_from(fifo: Path, timeout: float) -> int:
    """The PID the py-spy stand-in writes into ``fifo`` when it starts (blocking read in
    a thread: the event itself, no polling)."""
    got: list[str] = []

    def read() -> None:
        with open(fifo) as f:
            got.append(f.readline())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():  # never started: unblock the reader, then fail
        with open(fifo, "w"):
            pass
        reader.join(5)
        raise AssertionError("the daemon never ran py-spy")
    return int(got[0])


def test_py_spy_dies_with_a_sigkilled_daemon(start_daemon: Callable[..., Daemon],
                                             make_target: Callable[..., Target], tmp_path: Path) -> None:
    fifo = tmp_path / "py-spy.started"
    os.mkfifo(fifo)
    stand_in = tmp_path / "py-spy"
    stand_in.write_text(f"#!/bin/sh\necho $$ > {fifo}\nexec sleep 3600\n")  # hangs as py-spy can
    stand_in.chmod(0o755)
    d = start_daemon("--interval", "0.1", "--no-gpu", "--py-spy", str(stand_in), "--stack-timeout", "60")
    t = make_target()
    with d.client() as c:
        c.attach([t.pid])
        c.send(Stack(99, t.pid, True))  # a fresh stack: py-spy starts (the reply never comes)
        hung = _read_pid_from(fifo, 15)
    _dies_with_the_daemon(d, hung, "py-spy")


def test_austin_dies_with_a_sigkilled_daemon(start_daemon: Callable[..., Daemon],
                                             make_target: Callable[..., Target], tmp_path: Path) -> None:
    """The burst sampler, started by growth (no request): tied to the daemon's life too."""
    fifo = tmp_path / "austin.started"
    os.mkfifo(fifo)
    stand_in = tmp_path / "austin"
    stand_in.write_text(f"#!/bin/sh\necho $$ > {fifo}\nexec sleep 3600\n")  # hangs, as a stuck Austin would
    stand_in.chmod(0o755)
    d = start_daemon("--interval", "0.1", "--no-gpu", "--austin", str(stand_in))
    t = make_target()
    with d.client() as c:
        c.attach([t.pid])
        c.stack(t.pid)  # its first stack: the daemon follows its memory from here on
        t.do("alloc 64")  # 64 MiB between two ticks: a burst starts
        hung = _read_pid_from(fifo, 15)
    _dies_with_the_daemon(d, hung, "austin")


def _dies_with_the_daemon(d: Daemon, hung: int, what: str) -> None:
    """SIGKILL the daemon; the stand-in ``what`` (PID ``hung``) must exit too."""
    pidfd = os.pidfd_open(hung)  # pinned while it runs: readable once it has exited
    try:
        # The stand-in wrote its PID before its exec: wait for the exec, not a race with it.
        poll(f"the stand-in {what} runs sleep", lambda: os.readlink(f"/proc/{hung}/exe").endswith("sleep"))
        d.proc.kill()
        d.proc.wait(10)
        exited, _, _ = select.select([pidfd], [], [], 10)
        assert exited, f"{what} ({hung}) outlived the SIGKILLed daemon"
    finally:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        os.close(pidfd)


# --------------------------------------------------------------------------- 4. history with seconds = ±inf, nan


@pytest.mark.parametrize("seconds", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
def test_history_with_non_finite_seconds_is_invalid_and_the_connection_stays(
        daemon: Daemon, make_target: Callable[..., Target], seconds: float) -> None:
    t = make_target()
    with daemon.client() as c:
        c.attach([t.pid])  # a series to cut: the slot count is computed per watched process
    raw = RawClient(daemon.socket)
    try:
        raw.send({"t": "history", "id": 7, "pids": [], "seconds": seconds})
        reply = raw.reply(7)
        assert isinstance(reply, Error), reply
        assert reply.code == "invalid" and reply.message.startswith("history.seconds: expected a finite number")
        assert "\n" not in reply.message
        raw.send({"t": "status", "id": 8})  # the same connection serves on
        assert isinstance(raw.reply(8), StatusOk)
        raw.send({"t": "history", "id": 9, "pids": [t.pid], "seconds": 5.0})
        assert [s.pid for s in raw.reply(9).series] == [t.pid]  # type: ignore[attr-defined]
    finally:
        raw.close()
    assert "Traceback" not in daemon.log


# --------------------------------------------------------------------------- 5. one daemon per socket path


def test_a_second_daemon_refuses_even_when_the_socket_file_was_deleted(
        start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    path = str(tmp_path / "run" / "memagent.sock")
    first = start_daemon("--interval", "0.5", "--no-gpu", "--no-stacks", socket=path)
    os.unlink(path)
    second = start_daemon("--interval", "0.5", "--no-gpu", "--no-stacks", socket=path, wait=False)
    assert second.proc.wait(15) == 1
    second.stop()  # joins its log reader
    assert second.lines[-1] == f"memagent: a memagent daemon is already listening on {path}; not starting another"
    assert "Traceback" not in second.log and not os.path.exists(path)
    assert first.proc.poll() is None, "the refused daemon took the first one down"
    assert first.stop() == 0
    third = start_daemon("--interval", "0.5", "--no-gpu", "--no-stacks", socket=path)
    with third.client() as c:
        assert c.status().pid == third.proc.pid
