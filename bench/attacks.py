"""Every socket attack of docs/security.md at once, against a real daemon watching 500
processes: does the tick stay on time (target: worst lateness < 50 ms) and the daemon's
memory bounded (target: VmHWM < 60 MB)?

Phase 1 (baseline, no attack) then phase 2 (all attacks together, ATTACK_SECONDS):
- 3 clients (root: they see every process, the biggest replies) pipelining list and
  history requests for 4000 PIDs without ever reading;
- a client re-sending the 15,000-PID, 64 KiB-label attach, reconnecting each time;
- a subscriber that never reads;
- the test user opening 64 connections and sitting on them (lockout), as a second user;
- root's own client asking ``status`` every 0.25 s: each answer must come promptly.

Run as root: ``.venv/bin/python bench/attacks.py [pipeline amplify deaf lockout]``. It prints the figures and the
ratio against the baseline; it asserts nothing.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgpack

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fleet import Fleet, proc_status_kb, stop_daemon  # noqa: E402

from memagent.client import Client  # noqa: E402
from memproto import encode, frame_bytes  # noqa: E402
from memproto.client_side import ClientError, client_hello  # noqa: E402

PROCESSES = 500
BASELINE_SECONDS = 5.0
ATTACK_SECONDS = 15.0
TEST_USER = "memagent-test"


def raw(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall(frame_bytes(encode(client_hello("attacker"))))
    return s


def pipeliner(path: str, stop: threading.Event) -> None:
    s = raw(path)
    s.settimeout(0.2)
    pids = list(range(100_000, 104_000))
    chunk = b"".join(frame_bytes(msgpack.packb({"t": kind, "v": 1, "id": i, **extra}))
                     for i in range(20) for kind, extra in (("list", {}), ("history", {"pids": pids})))
    while not stop.is_set():
        try:
            s.sendall(chunk)
        except TimeoutError:
            continue  # the daemon stopped reading us: exactly what it should do
        except OSError:
            break
    s.close()


def amplifier(path: str, pid: int, stop: threading.Event) -> None:
    body = frame_bytes(msgpack.packb({"t": "attach", "v": 1, "id": 1, "pids": [pid] * 15_000, "label": "x" * 65_536}))
    while not stop.is_set():
        try:
            s = raw(path)
            s.sendall(body)
            s.settimeout(2)
            while s.recv(65536):
                pass
            s.close()
        except OSError:
            time.sleep(0.01)


def deaf_subscriber(path: str, stop: threading.Event) -> None:
    s = raw(path)
    s.sendall(frame_bytes(msgpack.packb({"t": "subscribe", "v": 1, "id": 1})))
    stop.wait()
    s.close()


def lockout(path: str, user: pwd.struct_passwd, stop_fd: int) -> int:
    """Fork the test user holding 64 connections until ``stop_fd`` is readable."""
    child = os.fork()
    if child == 0:
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
        held = []
        for _ in range(64):
            try:
                held.append(raw(path))
            except OSError:
                pass
        os.read(stop_fd, 1)
        os._exit(0)
    return child


ATTACKS = ("pipeline", "amplify", "deaf", "lockout")


def main(argv: list[str]) -> int:
    """``attacks.py [ATTACK...]``: all of :data:`ATTACKS` by default, or those named."""
    chosen = set(argv) or set(ATTACKS)
    if not chosen <= set(ATTACKS):
        print(f"usage: attacks.py [{' '.join(ATTACKS)}]")
        return 2
    if os.geteuid() != 0:
        print("run as root (the lockout attacker is a second user)")
        return 2
    try:
        user = pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER],
                       check=True)
        user = pwd.getpwnam(TEST_USER)
    tmp = tempfile.mkdtemp(prefix="memagent-attacks-", dir="/tmp")
    os.chmod(tmp, 0o755)
    sock = f"{tmp}/m.sock"
    fleet = Fleet(PROCESSES, python=10)
    daemon = None
    try:
        fleet.start()
        daemon = subprocess.Popen([sys.executable, "-m", "memagent.cli", "daemon", "--interval", "0.1", "--socket",
                                   sock, "--socket-group", TEST_USER, "--no-stacks"],
                                  stderr=subprocess.DEVNULL, preexec_fn=os.setpgrp)
        deadline = time.monotonic() + 15
        while not os.path.exists(sock) and time.monotonic() < deadline:
            time.sleep(0.05)
        with Client(sock) as c:
            c.attach(fleet.pids[:4000], label="fleet")
        slowest = [0.0, 0.0]

        def probe(until: float, phase: int) -> float:
            worst = 0.0
            with Client(sock) as c:
                while time.monotonic() < until:
                    t = time.monotonic()
                    lateness = c.status().tick.max_lateness
                    slowest[phase] = max(slowest[phase], time.monotonic() - t)
                    worst = max(worst, lateness)
                    time.sleep(0.25)
            return worst

        base = probe(time.monotonic() + BASELINE_SECONDS, 0)
        hwm_base = proc_status_kb(daemon.pid, "VmHWM")["VmHWM"] / 1024
        stop = threading.Event()
        r, w = os.pipe()
        child = lockout(sock, user, r) if "lockout" in chosen else None
        pipeliners = 3 if "pipeline" in chosen else 0
        threads = [threading.Thread(target=pipeliner, args=(sock, stop)) for _ in range(pipeliners)]
        if "amplify" in chosen:
            threads.append(threading.Thread(target=amplifier, args=(sock, fleet.pids[0], stop)))
        if "deaf" in chosen:
            threads.append(threading.Thread(target=deaf_subscriber, args=(sock, stop)))
        for t in threads:
            t.start()
        try:
            attacked = probe(time.monotonic() + ATTACK_SECONDS, 1)
        finally:
            stop.set()
            os.write(w, b"x")
            if child is not None:
                os.waitpid(child, 0)
            for t in threads:
                t.join(10)
        hwm = proc_status_kb(daemon.pid, "VmHWM")["VmHWM"] / 1024
        print(f"daemon at 0.1 s watching {PROCESSES} processes; {', '.join(sorted(chosen))} for {ATTACK_SECONDS:g} s")
        print(f"  worst tick lateness: baseline {base * 1000:.1f} ms, under attack {attacked * 1000:.1f} ms "
              f"(target < 50 ms)")
        print(f"  slowest status reply: baseline {slowest[0] * 1000:.1f} ms, under attack {slowest[1] * 1000:.1f} ms")
        print(f"  daemon VmHWM: baseline {hwm_base:.1f} MiB, after the attacks {hwm:.1f} MiB (target < 60 MB); "
              f"ratio {hwm / hwm_base:.2f}")
    except ClientError as exc:
        print(f"failed: {exc}")
        return 1
    finally:
        if daemon is not None:
            stop_daemon(daemon)  # type: ignore[arg-type]
        fleet.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
