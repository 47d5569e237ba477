"""Attach rules under attack (docs/security.md section 12): the second user pipelines
``attach --cgroup`` requests over one connection; then a restart on the state it left, and
one on a state with the most rules the caps allow (and one with 30,000).

Prints, for the flood: rules kept and refused, the daemon's own worst tick lateness
(``status``), its RSS before and after, the state file's size, how many times the file was
replaced (its inode changes at each write); for each restart: seconds from the daemon's
start to its first answer. Asserts nothing.

Run as root: ``.venv/bin/python bench/rules_flood.py [REQUESTS]`` (10,000 by default).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from memagent.client import Client
from memproto.frames import Attach, Error

USER = "memagent-test"
WINDOW = 200


def rss_kib(pid: int) -> int:
    return next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("VmRSS:"))


def start(sock: str, state: Path) -> tuple[subprocess.Popen[bytes], float]:
    """The daemon, and the seconds until it answered a ``list``."""
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "memagent.cli", "daemon", "--socket", sock, "--state-dir",
                             str(state), "--interval", "0.1", "--no-gpu", "--no-record", "--socket-group", USER],
                            stderr=subprocess.DEVNULL)
    while True:
        try:
            with Client(sock, timeout=600) as c:
                c.list()
            return proc, time.monotonic() - began
        except (OSError, Exception):  # noqa: BLE001 - not up yet
            if proc.poll() is not None:
                raise SystemExit("the daemon died") from None
            time.sleep(0.05)


def flood(sock: str, n: int, user: pwd.struct_passwd) -> dict[str, float]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
        kept = refused = 0
        began = time.monotonic()
        with Client(sock, timeout=600) as c:
            for first in range(0, n, WINDOW):
                count = min(WINDOW, n - first)
                for i in range(first, first + count):
                    c.send(Attach(i + 1, [], cgroup=f"/flood.slice/{i}", label="x" * 128))
                for _ in range(count):
                    if isinstance(c.recv(), Error):
                        refused += 1
                    else:
                        kept += 1
            lateness = c.status().tick.max_lateness
        os.write(w, json.dumps({"kept": kept, "refused": refused, "seconds": time.monotonic() - began,
                                "lateness": lateness}).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = json.loads(f.read())
    os.waitpid(pid, 0)
    return out


def watch_writes(path: Path, stop: threading.Event, seen: set[int]) -> None:
    while not stop.is_set():
        try:
            seen.add(path.stat().st_ino)
        except FileNotFoundError:
            pass
        time.sleep(0.01)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    user = pwd.getpwnam(USER)
    top = Path(tempfile.mkdtemp(prefix="memagent-rules-", dir="/tmp"))
    top.chmod(0o755)
    sock, state = str(top / "m.sock"), top / "state"
    try:
        proc, _ = start(sock, state)
        time.sleep(1)
        before = rss_kib(proc.pid)
        stop, inodes = threading.Event(), set()
        watcher = threading.Thread(target=watch_writes, args=(state / "state.json", stop, inodes))
        watcher.start()
        out = flood(sock, n, user)
        time.sleep(2.5)
        stop.set()
        watcher.join()
        print(f"flood of {n}: kept {out['kept']}, refused {out['refused']} in {out['seconds']:.1f} s; "
              f"worst tick lateness {out['lateness'] * 1000:.1f} ms; RSS {before} -> {rss_kib(proc.pid)} KiB; "
              f"state.json {(state / 'state.json').stat().st_size} bytes, written {len(inodes)} times")
        proc.terminate()
        proc.wait(30)
        proc, took = start(sock, state)
        print(f"restart on it: answered after {took:.2f} s")
        proc.terminate()
        proc.wait(30)
        for users, roots in ((1024, 1024), (29_000, 1_000)):
            rules = [{"kind": "cgroup", "value": f"/u.slice/{i}", "label": "x" * 128, "trusted": False,
                      "owner": 1000 + i // 64} for i in range(users)]
            rules += [{"kind": "unit", "value": f"m-{i}.service", "label": None, "trusted": True, "owner": None}
                      for i in range(roots)]
            (state / "state.json").write_text(json.dumps({"version": 1, "saved_at": time.time(), "entries": [],
                                                          "rules": rules}))
            proc, took = start(sock, state)
            with Client(sock) as c:
                lateness = c.status().tick.max_lateness
            print(f"restart with {users} users' and {roots} root's rules: answered after {took:.2f} s, "
                  f"worst tick lateness {lateness * 1000:.1f} ms")
            proc.terminate()
            proc.wait(30)
    finally:
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
