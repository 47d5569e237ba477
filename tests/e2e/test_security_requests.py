"""Attacks through the socket on the daemon's memory, its tick and its stacks
(docs/security.md), each by a real client against a real daemon, many as a second user.
Each asserts that the attack fails and that the daemon keeps sampling on time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import pytest
from conftest import Daemon, Target, as_user, spawn_with_pid

from memagent.client import Client
from memagent.config import StackConfig
from memagent.core.registry import Registry
from memagent.core.stack_collector import StackCollector
from memproto import encode, frame_bytes
from memproto.client_side import RequestFailed, client_hello
from memproto.vocabulary import ErrorCode, StackState

PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
needs_py_spy = pytest.mark.skipif(not os.access(PY_SPY, os.X_OK), reason="py-spy is not installed")
#: Loose on purpose (CI boxes are loaded); bench/attacks.py measures the real figure.
ON_TIME = 0.25


def daemon_hwm_mib(d: Daemon) -> float:
    for line in Path(f"/proc/{d.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def raw_client(path: str) -> socket.socket:
    """A connected client that has said hello and then does what a test makes it do."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall(frame_bytes(encode(client_hello("attacker"))))
    return s


def send_raw(s: socket.socket, body: dict[str, object]) -> None:
    s.sendall(frame_bytes(msgpack.packb({"v": 1, **body})))


# --------------------------------------------------------------------------- memory and the tick


def test_a_huge_repeated_attach_neither_grows_the_daemon_nor_stalls_it(daemon: Daemon, make_target:
                                                                       Callable[..., Target]) -> None:
    """15,000 repeats of one PID with a 64 KiB label (the reported 2 GB request, 110 KB) are
    refused on the frame's length, unread; 4,000 repeats with a valid label attach it once."""
    t = make_target()
    s = raw_client(daemon.socket)
    try:
        send_raw(s, {"t": "attach", "id": 1, "pids": [t.pid] * 15_000, "label": "x" * 65_536})
        s.settimeout(10)
        data = b""
        while chunk := s.recv(65536):  # the daemon answers with an error and closes
            data += chunk
    finally:
        s.close()
    assert b"too_large" in data and b"exceeds the limit of 65536 bytes" in data
    with daemon.client() as c:
        reply = c.attach([t.pid] * 4000, label="ok")
        assert [p.pid for p in reply.attached] == [t.pid]
        assert c.status().tick.max_lateness < ON_TIME
    assert daemon_hwm_mib(daemon) < 60


def test_a_request_of_a_million_tiny_containers_is_refused_unread(daemon: Daemon) -> None:
    """1 MiB of empty arrays (one byte each) would be a million objects: the frame is
    refused on its length prefix, before any byte of it is read or unpacked."""
    s = raw_client(daemon.socket)
    try:
        body = msgpack.packb({"t": "attach", "v": 1, "id": 1, "pids": [[[]] * 4000 for _ in range(250)]})
        assert len(body) > 1_000_000
        with contextlib.suppress(OSError):  # the daemon may close before all of it is sent
            s.sendall(frame_bytes(body))
        s.settimeout(10)
        data = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                data += chunk
    finally:
        s.close()
    assert b"too_large" in data
    with daemon.client() as c:
        assert c.status().tick.max_lateness < ON_TIME
    assert daemon_hwm_mib(daemon) < 60


def test_clients_pipelining_without_reading_stall_nothing(daemon: Daemon, make_target: Callable[..., Target]) -> None:
    """Three clients send hundreds of list and history requests and never read: replies
    wait one at a time, the socket stops being read, the tick stays on time, memory flat."""
    targets = [make_target() for _ in range(5)]
    with daemon.client() as c:
        c.attach([t.pid for t in targets], label="model")
    attackers = [raw_client(daemon.socket) for _ in range(3)]
    try:
        for s in attackers:
            s.setblocking(False)
        # 2 MB of requests each (a history asking for 4000 PIDs is 20 KB): more than the
        # kernel buffers between us, so a daemon that stops reading blocks the sender.
        pids = list(range(100_000, 104_000))
        request = b"".join(frame_bytes(msgpack.packb({"t": kind, "v": 1, "id": i, **extra}))
                           for i in range(50) for kind, extra in (("list", {}), ("history", {"pids": pids})))
        stuck = 0
        for s in attackers:
            try:
                s.sendall(request)
            except BlockingIOError:
                stuck += 1  # the daemon stopped reading this client: backpressure, not buffering
        deadline = time.monotonic() + 3
        with daemon.client() as c:  # an honest client is served meanwhile, and promptly
            while time.monotonic() < deadline:
                started = time.monotonic()
                assert {p.pid for p in c.list()} == {t.pid for t in targets}
                assert time.monotonic() - started < 1.0
            status = c.status()
        assert stuck == 3
        assert status.tick.max_lateness < ON_TIME
        assert daemon_hwm_mib(daemon) < 60
    finally:
        for s in attackers:
            s.close()


def test_a_label_that_forges_a_log_line_is_refused(daemon: Daemon, make_target: Callable[..., Target]) -> None:
    t = make_target()
    with daemon.client() as c:
        with pytest.raises(RequestFailed, match="label: a label holds printable characters only") as info:
            c.attach([t.pid], label="run\nmemagent: CRITICAL: forged")
        assert info.value.code == ErrorCode.INVALID
        assert c.list() == []


# --------------------------------------------------------------------------- connections


def test_one_user_cannot_lock_others_out(test_user: pwd.struct_passwd, shared_dir: str,
                                         start_daemon: Callable[..., Daemon]) -> None:
    """The test user opens 20 connections and sits on them: past its share it is refused
    with `busy`, and root still gets in while it holds them."""
    d = start_daemon("--interval", "0.1", "--socket-group", test_user.pw_name, socket=f"{shared_dir}/m.sock")
    to_parent, from_child = os.pipe()[::-1]
    to_child_r, to_child_w = os.pipe()
    child = os.fork()
    if child == 0:  # the test user: hold as many connections as it can, until told to stop
        os.setgroups([])
        os.setgid(test_user.pw_gid)
        os.setuid(test_user.pw_uid)
        held, refused = [], []
        try:
            for _ in range(20):
                try:
                    held.append(Client(d.socket))
                except RequestFailed as exc:
                    refused.append(exc.code)
            result: dict[str, object] = {"held": len(held), "refused": refused}
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the test
            result = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(to_parent, json.dumps(result).encode())
        os.read(to_child_r, 1)
        os._exit(0)
    os.close(to_parent)
    try:
        out = json.loads(os.read(from_child, 65536))
        assert "error" not in out, out
        with d.client() as c:  # root, while the user holds its connections
            assert c.status().clients >= 1 + out["held"]
    finally:
        os.write(to_child_w, b"x")
        os.waitpid(child, 0)
    assert out["held"] == 8
    assert out["refused"] == [ErrorCode.BUSY] * 12


def test_idle_connections_are_closed_and_subscribers_kept(start_daemon: Callable[..., Daemon],
                                                           tmp_path: Path) -> None:
    """A client that said hello and then nothing is closed after ``[clients] idle_timeout``
    with error `idle`; a subscriber (which reads its samples) is kept."""
    cfg = tmp_path / "m.toml"
    cfg.write_text("[clients]\nidle_timeout = 0.5\n")
    d = start_daemon("--interval", "0.1", "--config", str(cfg))
    idle = raw_client(d.socket)
    with d.client() as subscriber:
        subscriber.subscribe()
        idle.settimeout(10)
        data = b""
        while chunk := idle.recv(65536):  # the daemon closes it: EOF ends this loop
            data += chunk
        assert b"idle" in data and b"no request for 0.5 s" in data
        with d.client() as c:
            assert c.status().clients == 2  # the subscriber (and this client), not the idle one
        assert next(iter(subscriber.stream())) is not None  # still served
    idle.close()


# --------------------------------------------------------------------------- stacks


@needs_py_spy
@pytest.mark.skipif(os.geteuid() != 0, reason="steering PIDs through ns_last_pid needs root")
def test_a_stack_is_never_taken_from_the_process_that_reused_the_pid(make_target: Callable[..., Target]) -> None:
    """The watched process exits and its PID goes to another Python process before the
    next tick: the dump is refused, the newcomer's stack is never recorded as the old's."""
    old = make_target()
    registry = Registry()
    (w,) = registry.attach(old.pid)
    old.kill()
    newcomer = spawn_with_pid(old.pid, [sys.executable, "-c", "import sys; sys.stdin.read()"])
    if newcomer is None:
        pytest.skip("could not get the same PID back (busy system)")
    try:
        async def demand() -> StackCollector:
            collector = StackCollector(StackConfig(py_spy=PY_SPY))
            runner = asyncio.ensure_future(collector.run())
            await collector.demand(w)
            runner.cancel()
            return collector

        collector = asyncio.run(demand())
        ps = collector.stacks[w.key]
        assert ps.state == StackState.EXITED
        assert ps.latest is None and ps.at_peak is None
    finally:
        newcomer.kill()
        newcomer.wait()
        registry.close()


NOT_DUMPABLE = ("import ctypes, os, sys, time\n"
                "if sys.argv[1] == 'no': ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\n"
                "if len(sys.argv) > 2:  # started as root: keep root as the saved UID, as setuid programs do\n"
                "    uid, gid = int(sys.argv[2]), int(sys.argv[3])\n"
                "    os.setgroups([]); os.setresgid(gid, gid, gid); os.setresuid(uid, uid, 0)\n"
                "print('ready', flush=True)\n"
                "time.sleep(600)\n")


@pytest.fixture
def user_python(test_user: pwd.struct_passwd) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Python processes of the test user (the system python3), dumpable or not."""
    started: list[subprocess.Popen[str]] = []

    def start(dumpable: bool, saved_root: bool = False) -> subprocess.Popen[str]:
        uid, gid = test_user.pw_uid, test_user.pw_gid
        argv = ["/usr/bin/python3", "-c", NOT_DUMPABLE, "yes" if dumpable else "no"]
        if saved_root:  # it drops to the user itself (exec would reset the saved UID)
            proc = subprocess.Popen([*argv, str(uid), str(gid)], stdout=subprocess.PIPE, text=True, cwd="/")
        else:
            proc = subprocess.Popen(argv, user=uid, group=gid, extra_groups=[], stdout=subprocess.PIPE, text=True,
                                    cwd="/")
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        started.append(proc)
        return proc

    yield start
    for p in started:
        p.kill()
        p.wait()


@needs_py_spy
def test_a_user_gets_no_stack_of_its_own_non_dumpable_or_setuid_process(
    test_user: pwd.struct_passwd, shared_dir: str, start_daemon: Callable[..., Daemon],
    user_python: Callable[..., subprocess.Popen[str]],
) -> None:
    d = start_daemon("--interval", "0.2", "--socket-group", test_user.pw_name, socket=f"{shared_dir}/m.sock")
    hidden, open_, setuid = user_python(False), user_python(True), user_python(True, saved_root=True)

    def ask() -> dict[str, object]:
        out: dict[str, object] = {}
        with Client(d.socket, timeout=30) as c:
            c.attach([hidden.pid, open_.pid, setuid.pid])
            for name, pid in (("hidden", hidden.pid), ("open", open_.pid), ("setuid", setuid.pid)):
                try:
                    out[name] = c.stack(pid).state
                except RequestFailed as exc:
                    out[name] = [exc.code, str(exc)]
        return out

    out = as_user(test_user, ask)
    assert isinstance(out, dict)
    assert out["hidden"][0] == ErrorCode.PERMISSION_DENIED and "not readable by you" in out["hidden"][1]
    assert out["setuid"][0] == ErrorCode.PERMISSION_DENIED  # its saved UID is root's
    assert out["open"] == StackState.OK  # its own dumpable process: allowed, and read
    with d.client(timeout=30) as c:  # root may read both
        assert c.stack(hidden.pid).state == StackState.OK
