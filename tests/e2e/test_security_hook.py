"""The root hook cannot be steered by clients, end to end with a real daemon, real
processes and a real hook command: it runs as ``nobody`` with a minimal environment, at
most once per ``hook_min_interval`` per alert key (the last state still arrives), and a
process name or a label holding a newline forges no log line and no line of
``memagent ls``. The hook writes each run as one line into a FIFO the test reads
(an event, not a poll)."""

from __future__ import annotations

import itertools
import json
import os
import select
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Daemon, Target, memagent_cli

from memagent.alerting.hooks import LANG
from memagent.config import HOOK_PATH as PATH
from memproto.client_side import RequestFailed
from memproto.frames import AlertRaised, Exited
from memproto.records import Alert

ROOT = os.geteuid() == 0
#: 15 bytes, the most a process name holds: a newline, then the start of a forged line.
FORGED_COMM = "\nmemagent: CRIT"
FORGED_LABEL = "l\nmemagent: CRITICAL: forged"


class HookPipe:
    """A hook script, in a directory every user can traverse, that writes each run as one
    line (start time, uid, groups, cwd, environment names, HOME, the alert's JSON) into a
    FIFO every user may write; the test holds the FIFO open and reads the lines."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="memagent-hook-", dir="/tmp"))
        self.dir.chmod(0o755)
        self.fifo = self.dir / "runs"
        os.mkfifo(self.fifo)
        self.fifo.chmod(0o666)
        script = self.dir / "hook.sh"
        script.write_text(
            "#!/bin/sh\nalert=$(cat)\n"
            "printf '%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\n' \"$(date +%s.%N)\" \"$(id -u)\" \"$(id -G)\" \"$(pwd)\" "
            f"\"$(env | cut -d= -f1 | tr '\\n' ' ')\" \"$HOME\" \"$alert\" > {self.fifo}\n"
        )
        script.chmod(0o755)
        self.argv = ["/bin/sh", str(script)]
        # Read and write: the FIFO always has a writer, so select() waits for data.
        self.fd = os.open(self.fifo, os.O_RDWR | os.O_NONBLOCK)
        self._buffer = b""

    def next_run(self, timeout: float = 15.0) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            readable, _, _ = select.select([self.fd], [], [], max(0.0, left))
            assert readable, f"the hook did not run within {timeout} s"
            self._buffer += os.read(self.fd, 65536)
        line, self._buffer = self._buffer.split(b"\n", 1)
        when, uid, groups, cwd, env, home, alert = line.decode().split("\t")
        return {"time": float(when), "uid": int(uid), "groups": groups.split(), "cwd": cwd, "env": env.split(),
                "home": home, "alert": json.loads(alert)}

    def close(self) -> None:
        os.close(self.fd)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def hook_pipe() -> Iterator[HookPipe]:
    pipe = HookPipe()
    yield pipe
    pipe.close()


def config(tmp: Path, text: str) -> str:
    path = tmp / "memagent.toml"
    path.write_text(text)
    return str(path)


def next_alert(c: object, pred: Callable[[Alert], bool], frames: int = 300) -> Alert:
    for n, frame in enumerate(c.stream()):  # type: ignore[attr-defined]
        if isinstance(frame, AlertRaised) and pred(frame.alert):
            return frame.alert
        assert n < frames, "no such alert"
    raise AssertionError("stream ended")


# --------------------------------------------------------------------------- who, with what


@pytest.mark.skipif(not ROOT, reason="the daemon switches the hook to hook_user only when it is root")
def test_the_daemon_runs_its_hook_as_nobody_without_its_environment(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], tmp_path: Path, hook_pipe: HookPipe
) -> None:
    cfg = config(tmp_path, f'interval = 0.1\n[host]\ncapacity = "50MiB"\n'
                           f'[alerts]\nhook = {json.dumps(hook_pipe.argv)}\n')
    d = start_daemon("--config", cfg, env={**os.environ, "MEMAGENT_SECRET": "x"})
    t = make_target()
    t.do("alloc 60")
    with d.client() as c:
        c.attach([t.pid])
    run = hook_pipe.next_run()
    assert run["alert"]["kind"] == "headroom"  # type: ignore[index]
    assert run["uid"] == 65534 and run["groups"] == ["65534"]  # nobody, no supplementary groups
    assert run["cwd"] == "/" and run["home"] == "/nonexistent"
    env = set(run["env"])  # type: ignore[arg-type]
    assert "MEMAGENT_SECRET" not in env
    assert {"PATH", "LANG", "HOME", "MEMAGENT_ALERT_KIND"} <= env <= {"PATH", "LANG", "HOME", "MEMAGENT_ALERT_KIND",
                                                                      "PWD"}  # PWD: the shell's own
    assert (PATH, LANG) == ("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "C.UTF-8")


def test_an_unknown_hook_user_is_a_config_error(start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    cfg = config(tmp_path, '[alerts]\nhook = ["/bin/true"]\nhook_user = "memagent-no-such-user"\n')
    checked = memagent_cli("check-config", cfg)
    assert checked.returncode == 2
    assert "alerts.hook_user: no such user: 'memagent-no-such-user'" in checked.stderr
    d = start_daemon("--config", cfg, wait=False)
    assert d.proc.wait(30) == 2
    d.stop()  # every log line is read
    assert any("invalid configuration" in line and "alerts.hook_user: no such user" in line for line in d.lines)


# --------------------------------------------------------------------------- how often


def test_a_client_flapping_an_alert_runs_the_hook_once_per_window_and_the_last_state_arrives(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], tmp_path: Path, hook_pipe: HookPipe
) -> None:
    window = 1.0
    cfg = config(tmp_path, f'interval = 0.1\n[host]\ncapacity = "50MiB"\n[alerts]\nhook = '
                           f'{json.dumps(hook_pipe.argv)}\nhook_min_interval = {window}\n')
    d = start_daemon("--config", cfg)
    t = make_target()
    delivered = 0
    with d.client() as c:
        c.attach([t.pid])
        c.subscribe()
        started = time.monotonic()
        for _ in range(12):  # what a client can do at will: its own process over the headroom and back
            t.do("alloc 60")
            fired = next_alert(c, lambda a: a.kind == "headroom" and a.state == "firing")
            t.do("free")
            c.reset_peaks([t.pid])
            last = next_alert(c, lambda a: a.kind == "headroom" and a.state == "resolved")
            delivered += 2
        flapped = time.monotonic() - started
    assert last.id == fired.id
    runs = [hook_pipe.next_run()]
    while not (runs[-1]["alert"]["state"] == "resolved" and runs[-1]["alert"]["id"] == last.id):  # type: ignore[index]
        runs.append(hook_pipe.next_run(timeout=window + 10))
    starts = [float(r["time"]) for r in runs]  # type: ignore[arg-type]
    assert all(b - a >= window - 0.1 for a, b in itertools.pairwise(starts)), starts  # one run per window
    assert len(runs) <= flapped / window + 2 < delivered, (len(runs), flapped, delivered)
    assert any("come faster than the hook may run (once per 1 s" in line for line in d.lines), d.log


# --------------------------------------------------------------------------- what is written


def test_a_process_name_or_label_with_a_newline_forges_no_log_line_and_no_ls_line(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], tmp_path: Path
) -> None:
    # The process name (comm) is the executable's name: a link to Python named FORGED_COMM.
    link = tmp_path / FORGED_COMM
    link.symlink_to(os.path.realpath(sys.executable))
    cfg = config(tmp_path, 'interval = 0.2\n[host]\ncapacity = "2GiB"\n'
                           '[alerts]\nleak_window = 4\nleak_min_rate = "60MiB"\nleak_horizon = 600\n')
    d = start_daemon("--config", cfg)
    forged = make_target(python=str(link))
    assert Path(f"/proc/{forged.pid}/comm").read_text() == FORGED_COMM + "\n"
    labelled = make_target()
    with d.client() as c:
        c.attach([forged.pid])
        try:  # a daemon that validates labels refuses it; one that does not must quote it
            c.attach([labelled.pid], label=FORGED_LABEL)
        except RequestFailed:
            pass
        c.subscribe()
        forged.do("leak 5")  # the leak alert's message names the process
        leak = next_alert(c, lambda a: a.kind == "leak" and a.state == "firing", frames=400)
        assert leak.pid == forged.pid and "\\nmemagent: CRIT" in leak.message
        ls = memagent_cli("ls", "--socket", d.socket)
        ls_json = memagent_cli("ls", "--json", "--socket", d.socket)
        status = memagent_cli("status", "--socket", d.socket)
        c.detach([labelled.pid])
        forged.kill()  # watched when it exits: an "exited" log line with its name
        for frame in c.stream():
            if isinstance(frame, Exited) and frame.pid == forged.pid:
                break
    d.stop()  # every log line is read
    assert not any(line.startswith("memagent: CRIT") for line in d.lines), d.log
    assert not any("forged" in line and not line.startswith("memagent: ") for line in d.lines), d.log
    assert any(f"attached {forged.pid} (\\nmemagent: CRIT)" in line for line in d.lines), d.log
    assert any(f"{forged.pid} (\\nmemagent: CRIT) exited" in line for line in d.lines), d.log
    assert any("alert leak firing" in line and "\\nmemagent: CRIT" in line for line in d.lines), d.log
    # memagent ls: one line per process, the name escaped; --json keeps the exact name.
    assert ls.returncode == 0 and len(ls.stdout.splitlines()) == 1 + len(json.loads(ls_json.stdout)), ls.stdout
    assert "\\nmemagent: CRIT" in ls.stdout
    assert any(p["name"] == FORGED_COMM for p in json.loads(ls_json.stdout))
    assert status.returncode in (4, 5)  # the leak alert is firing: status is a health check (docs/cli.md)
    assert not any(line.startswith("memagent: CRIT") for line in status.stdout.splitlines()), status.stdout


def test_attach_refuses_a_label_with_a_newline_as_a_usage_error(tmp_path: Path) -> None:
    for label in ("bad\nlabel", "x" * 129, ""):
        r = memagent_cli("attach", "--socket", str(tmp_path / "none.sock"), "1", "--label", label)
        assert r.returncode == 2, r
        assert r.stderr.startswith("memagent attach: --label: ") and len(r.stderr.splitlines()) == 1, r.stderr
        assert r.stdout == ""
