"""End to end: the real daemon watching real processes, over its real socket."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import time
from collections.abc import Callable

import msgpack
import pytest
from conftest import Daemon, MiB, Target, memagent_cli, wait_sample

from memagent.client import Client
from memproto import PROTOCOL_MAJOR, FrameBuffer, decode, frame_bytes
from memproto.client_side import RequestFailed
from memproto.frames import Dropped, Error, Exited, Hello, Sample


def _hwm_bytes(t: Target) -> int:
    return t.status_kb("VmHWM") * 1024


def test_rss_and_peak_match_the_kernel(daemon: Daemon, make_target: Callable[..., Target]) -> None:
    t = make_target()
    sampled: list[int] = []

    def seen(pred: Callable[[dict[str, object]], bool]) -> Callable[[dict[str, object]], bool]:
        def check(row: dict[str, object]) -> bool:
            sampled.append(row["rss_bytes"])  # type: ignore[arg-type]
            return pred(row)
        return check

    with daemon.client() as c:
        (info,) = c.attach([t.pid], label="t").attached
        sampled.append(info.rss_bytes)
        c.subscribe()
        before = wait_sample(c, t.pid, seen(lambda r: True))["rss_bytes"]
        t.do("alloc 200")
        vmrss = t.status_kb("VmRSS") * 1024
        row = wait_sample(c, t.pid, seen(lambda r: r["rss_bytes"] >= vmrss - MiB))
        # Reported RSS is the kernel's, and the growth is what the process allocated.
        assert abs(row["rss_bytes"] - vmrss) <= 2 * MiB
        assert 195 * MiB <= row["rss_bytes"] - before <= 215 * MiB
        t.do("free")
        row = wait_sample(c, t.pid, seen(lambda r: r["rss_bytes"] < vmrss - 150 * MiB))
        # Idle now: the daemon's peak is the kernel's VmHWM read at the same time, unless a
        # sample saw more (the kernel's RSS counters are per-CPU approximations, and the
        # peak is never lower than a value sampled).
        hwm = _hwm_bytes(t)
        assert row["rss_peak_bytes"] == max(hwm, *sampled)
        assert row["rss_peak_bytes"] - hwm < MiB
        listed = {p.pid: p for p in c.list()}[t.pid]
        assert listed.rss_peak_bytes == max(_hwm_bytes(t), *sampled)
        assert listed.rss_peak_exact


def test_spike_between_ticks_shows_in_peak(start_daemon: Callable[..., Daemon],
                                           make_target: Callable[..., Target]) -> None:
    # A 2 s interval: the spike (~0.1 s) almost surely falls between two ticks, and the
    # status refresh (1 s) is shorter than the interval, so VmHWM is read each tick.
    d = start_daemon("--interval", "2")
    t = make_target()
    with d.client() as c:
        c.attach([t.pid])
        c.subscribe()
        wait_sample(c, t.pid, lambda r: True)
        t.do("spike 150")
        assert t.status_kb("VmRSS") * 1024 < 100 * MiB  # the spike is gone already
        row = wait_sample(c, t.pid, lambda r: r["rss_peak_bytes"] >= 150 * MiB, max_frames=5)
        assert row["rss_bytes"] < 100 * MiB
        assert row["rss_peak_bytes"] == _hwm_bytes(t)


def test_exit_is_detected_and_peak_kept(daemon: Daemon, make_target: Callable[..., Target]) -> None:
    t = make_target()
    t.do("alloc 50")
    with daemon.client() as c:
        c.attach([t.pid], label="short-lived")
        c.subscribe()
        peak = wait_sample(c, t.pid, lambda r: r["rss_bytes"] >= 50 * MiB)["rss_peak_bytes"]
        t.exit()
        exited = next(f for f in c.stream() if isinstance(f, Exited))
        assert exited.pid == t.pid and exited.rss_peak_bytes >= peak
        info = {p.pid: p for p in c.list()}[t.pid]
        assert not info.alive and info.exited_at is not None
        assert info.rss_peak_bytes >= 50 * MiB and info.label == "short-lived"
        # Still in the sample frames, as exited.
        assert wait_sample(c, t.pid, lambda r: True)["alive"] is False
        c.detach([t.pid])
        assert t.pid not in {p.pid for p in c.list()}


def test_reset_peaks_starts_a_new_window(daemon: Daemon, make_target: Callable[..., Target]) -> None:
    """With --kernel, the kernel's mark restarts too: the new window is exact at once."""
    t = make_target()
    with daemon.client() as c:
        c.attach([t.pid])
        t.do("spike 120")
        c.subscribe()
        wait_sample(c, t.pid, lambda r: r["rss_peak_bytes"] >= 120 * MiB)
        before = time.time()
        r = memagent_cli("reset-peaks", "--kernel", "--socket", daemon.socket, str(t.pid), "--json")
        assert r.returncode == 0, r.stderr
        row = wait_sample(c, t.pid, lambda r: r["rss_peak_bytes"] < 100 * MiB)
        assert row["rss_peak_bytes"] == _hwm_bytes(t)
        info = {p.pid: p for p in c.list()}[t.pid]
        assert info.peak_since >= before and info.rss_peak_exact


def test_two_clients_get_the_same_ticks(daemon: Daemon, make_target: Callable[..., Target]) -> None:
    t = make_target()
    with daemon.client() as a, daemon.client() as b:
        a.attach([t.pid])
        a.subscribe()
        b.subscribe()
        seq_a = {f.seq for f in _samples(a, 5)}
        seq_b = {f.seq for f in _samples(b, 5)}
        assert seq_a & seq_b, (seq_a, seq_b)


def _samples(c: Client, n: int) -> list[Sample]:
    out: list[Sample] = []
    for f in c.stream():
        if isinstance(f, Sample):
            out.append(f)
            if len(out) == n:
                return out
    raise AssertionError("stream ended")


def _raw_connect(path: str, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(10)
    s.connect(path)
    return s


def _send(s: socket.socket, body: dict[str, object]) -> None:
    s.sendall(frame_bytes(msgpack.packb(body)))


def _read_frames(s: socket.socket, until: Callable[[object], bool]) -> list[object]:
    buf = FrameBuffer()
    frames: list[object] = []
    while True:
        data = s.recv(65536)
        if not data:
            return frames
        for payload in buf.feed(data):
            frames.append(decode(payload))
            if until(frames[-1]):
                return frames


def _hello() -> dict[str, object]:
    return {"t": "hello", "v": PROTOCOL_MAJOR, "version": [PROTOCOL_MAJOR, 0], "role": "client", "software": "t"}


def test_a_client_that_never_reads_does_not_stall_another(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon("--interval", "0.02")
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(200)]
    try:
        stuck = _raw_connect(d.socket, rcvbuf=4096)
        _send(stuck, _hello())
        _send(stuck, {"t": "subscribe", "v": PROTOCOL_MAJOR, "id": 1})
        with d.client() as c:
            c.attach([p.pid for p in sleepers])
            c.subscribe()
            # Read on while the stuck client's buffers fill and its samples are dropped.
            frames: list[Sample] = []
            while len(frames) < 3000:
                frames += _samples(c, 25)
                if c.status().dropped_samples > 50:
                    break
            assert c.status().dropped_samples > 50, "the stuck client never overflowed"
            seqs = [f.seq for f in frames]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "the reading client lost ticks"
            assert c.status().tick.overruns <= 5
        # The stuck client is told how many samples it lost once it reads again.
        got = _read_frames(stuck, lambda f: isinstance(f, Dropped))
        dropped = [f for f in got if isinstance(f, Dropped)]
        assert dropped and dropped[0].count > 50
        stuck.close()
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


@pytest.mark.parametrize(
    "payload, code",
    [
        (b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1", "protocol"),  # 0xc1 is never valid msgpack
        (struct.pack(">I", 2 * MiB), "too_large"),  # announces more than a client may send
        (frame_bytes(msgpack.packb([1, 2, 3])), "protocol"),  # not a map
        (frame_bytes(msgpack.packb({"t": "list", "v": PROTOCOL_MAJOR, "id": 1})), "protocol"),  # no hello
    ],
    ids=["garbage", "oversized", "not-a-map", "no-hello"],
)
def test_bad_input_gets_an_error_and_a_closed_connection(daemon: Daemon, payload: bytes, code: str) -> None:
    s = _raw_connect(daemon.socket)
    s.sendall(payload)
    frames = _read_frames(s, lambda f: False)  # until the daemon closes
    errors = [f for f in frames if isinstance(f, Error)]
    assert [e.code for e in errors] == [code], frames
    assert errors[0].id is None and errors[0].message
    s.close()
    # The daemon goes on serving everyone else.
    with daemon.client() as c:
        assert c.status().pid == daemon.proc.pid


def test_incompatible_major_version_is_refused_clearly(daemon: Daemon) -> None:
    s = _raw_connect(daemon.socket)
    hello = {**_hello(), "v": PROTOCOL_MAJOR + 1, "version": [PROTOCOL_MAJOR + 1, 0]}
    _send(s, hello)
    frames = _read_frames(s, lambda f: False)
    assert isinstance(frames[0], Hello)
    err = frames[-1]
    assert isinstance(err, Error) and err.code == "version"
    assert f"v{PROTOCOL_MAJOR + 1}" in err.message and f"v{PROTOCOL_MAJOR}" in err.message


def test_invalid_request_is_answered_and_the_connection_kept(daemon: Daemon) -> None:
    with daemon.client() as c:
        c.send_raw = None  # type: ignore[attr-defined]
        c._sock.sendall(frame_bytes(msgpack.packb({"t": "attach", "v": PROTOCOL_MAJOR, "id": 7, "pids": ["x"]})))
        err = c.recv()
        assert isinstance(err, Error) and err.id == 7 and err.code == "invalid"
        assert "attach.pids[0]" in err.message
        c._sock.sendall(frame_bytes(msgpack.packb({"t": "frobnicate", "v": PROTOCOL_MAJOR, "id": 8})))
        err = c.recv()
        assert isinstance(err, Error) and err.id == 8 and err.code == "unknown_request"
        assert c.list() == []


def test_unknown_optional_fields_are_ignored(daemon: Daemon, make_target: Callable[..., Target]) -> None:
    t = make_target()
    s = _raw_connect(daemon.socket)
    _send(s, {**_hello(), "future_field": {"x": 1}})
    _send(s, {"t": "attach", "v": PROTOCOL_MAJOR, "id": 1, "pids": [t.pid], "priority": "high"})
    frames = _read_frames(s, lambda f: getattr(f, "id", None) == 1)
    assert frames[-1].TYPE == "attach_ok" and frames[-1].attached[0].pid == t.pid  # type: ignore[attr-defined]
    s.close()


def test_late_client_sees_recent_history(daemon: Daemon, make_target: Callable[..., Target]) -> None:
    t = make_target()
    with daemon.client() as c:
        c.attach([t.pid])
        c.subscribe()
        t.do("alloc 80")
        wait_sample(c, t.pid, lambda r: r["rss_bytes"] >= 80 * MiB)
        t.do("free")
        wait_sample(c, t.pid, lambda r: r["rss_bytes"] < 60 * MiB)
    with daemon.client() as late:
        h = late.history([t.pid])
        (series,) = h.series
        assert series.pid == t.pid and h.step == 1.0
        assert max(series.rss_bytes) >= 80 * MiB  # the past peak, kept by the daemon
        assert series.end_time >= time.time() - 2


def test_daemon_refuses_a_second_daemon_and_replaces_a_stale_socket(
    start_daemon: Callable[..., Daemon], sock_path: str
) -> None:
    # A stale socket file (nobody listening) is replaced.
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(sock_path)
    stale.close()
    first = start_daemon("--interval", "0.5", socket=sock_path)
    assert os.stat(sock_path).st_mode & 0o777 == 0o660
    second = start_daemon("--interval", "0.5", socket=sock_path, wait=False)
    assert second.proc.wait(15) == 1
    second._reader.join(5)
    assert "already listening" in second.log and len(second.lines) == 1, second.log
    # The first one is unharmed and stops cleanly, removing its socket.
    with first.client() as c:
        c.status()
    assert first.stop() == 0
    assert not os.path.exists(sock_path)


def test_cli_contract(daemon: Daemon, make_target: Callable[..., Target], tmp_path: object) -> None:
    t = make_target()
    r = memagent_cli("attach", "--socket", daemon.socket, str(t.pid), "--label", "model-a")
    assert r.returncode == 0, r.stderr
    r = memagent_cli("ls", "--socket", daemon.socket, "--json")
    assert r.returncode == 0
    (item,) = __import__("json").loads(r.stdout)
    for key in ("pid", "name", "cmdline", "label", "alive", "start_time", "attached_at", "rss_bytes",
                "rss_peak_bytes", "anon_bytes", "swap_bytes"):
        assert key in item, key
    assert item["pid"] == t.pid and item["label"] == "model-a" and item["alive"] is True
    assert isinstance(item["cmdline"], list) and item["cmdline"][-1].endswith("target_proc.py")
    assert item["start_time"] <= item["attached_at"] <= time.time()
    # Errors: one line, exact text, exit codes.
    missing = 4_000_000  # above pid_max on any default system
    r = memagent_cli("attach", "--socket", daemon.socket, str(missing))
    assert (r.returncode, r.stderr) == (1, f"no such process: {missing}\n")
    nowhere = str(tmp_path) + "/none.sock"
    r = memagent_cli("ls", "--socket", nowhere)
    assert (r.returncode, r.stderr) == (2, f"no memagent daemon at {nowhere} (start one with: memagent daemon)\n")
    r = memagent_cli("ls", env={"MEMAGENT_SOCKET": daemon.socket})
    assert r.returncode == 0 and str(t.pid) in r.stdout and "model-a" in r.stdout
    r = memagent_cli("detach", "--socket", daemon.socket, str(t.pid))
    assert r.returncode == 0
    r = memagent_cli("status", "--socket", daemon.socket, "--json")
    status = __import__("json").loads(r.stdout)
    assert status["watched"] == 0 and status["host"]["total_bytes"] > 0


def test_non_python_processes_work_too(daemon: Daemon) -> None:
    proc = subprocess.Popen(["sleep", "600"])
    try:
        with daemon.client() as c:
            (info,) = c.attach([proc.pid]).attached
            assert info.name == "sleep" and info.rss_bytes > 0 and info.rss_peak_bytes >= info.rss_bytes
    finally:
        proc.kill()
        proc.wait()


def test_attach_is_idempotent_and_relabels(daemon: Daemon, make_target: Callable[..., Target]) -> None:
    t = make_target()
    with daemon.client() as c:
        c.attach([t.pid], label="a")
        c.attach([t.pid], label="b")
        (info,) = c.list()
        assert info.label == "b"
        with pytest.raises(RequestFailed):
            c.request(__import__("memproto").frames.Hello([1, 0], "client", "x"), Hello)
