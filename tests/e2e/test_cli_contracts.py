"""The ``memagent`` command line's contracts (docs/cli.md), end to end: the real command
against a real daemon. Global options before or after the command; errors as JSON on
stdout with ``--json``; ``detach``'s "not watched" and "no such process"; ``status``'s exit
code as a health check."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import Daemon, Target, memagent_cli

from memagent.client import Client
from memproto.frames import AlertRaised
from memproto.records import Alert

EXIT_WARNING, EXIT_CRITICAL = 4, 5


def _absent_pid() -> int:
    """A PID no process has now (the kernel's default limits stop far below 4 000 000)."""
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


def _json(r: subprocess.CompletedProcess[str]) -> Any:
    assert r.stdout.count("\n") == 1, r.stdout  # one JSON document, one line
    return json.loads(r.stdout)


def _error(r: subprocess.CompletedProcess[str], code: str, rc: int, pid: int | None = None) -> str:
    """Check an error run: exit ``rc``, the one line on stderr, the same error as JSON on
    stdout; returns the message."""
    assert r.returncode == rc, r
    assert len(r.stderr.splitlines()) == 1, r.stderr
    doc = _json(r)
    assert isinstance(doc, dict) and set(doc["error"]) == {"code", "message", "pid"}, doc
    assert doc["error"]["code"] == code and doc["error"]["pid"] == pid, doc
    message = doc["error"]["message"]
    assert isinstance(message, str) and message in r.stderr
    return message


# --------------------------------------------------------------------------- global options


def test_global_options_go_before_or_after_the_command(daemon: Daemon, make_target: Callable[..., Target],
                                                       tmp_path: Path) -> None:
    t = make_target()
    assert memagent_cli("--socket", daemon.socket, "attach", str(t.pid), "--label", "g").returncode == 0
    before = memagent_cli("--socket", daemon.socket, "ls")
    after = memagent_cli("ls", "--socket", daemon.socket)
    assert before.returncode == after.returncode == 0, before.stderr
    assert str(t.pid) in before.stdout and before.stdout.splitlines()[0] == after.stdout.splitlines()[0]
    for argv in (("--json", "--socket", daemon.socket, "ls"), ("--socket", daemon.socket, "ls", "--json"),
                 ("--json", "ls", "--socket", daemon.socket)):
        r = memagent_cli(*argv)
        assert r.returncode == 0, r
        assert [p["pid"] for p in _json(r)] == [t.pid]
    r = memagent_cli("--json", "--socket", daemon.socket, "status")
    assert r.returncode == 0 and _json(r)["watched"] == 1
    # Given on both sides: the one after the command wins.
    nowhere = str(tmp_path / "none.sock")
    assert memagent_cli("--socket", nowhere, "ls", "--socket", daemon.socket).returncode == 0
    assert memagent_cli("--socket", daemon.socket, "ls", "--socket", nowhere).returncode == 2
    # A global option the command does not take is a usage error, as JSON when asked.
    r = memagent_cli("--json", "check-config", str(tmp_path / "x.toml"))
    assert "--json is not an option of check-config" in _error(r, "usage", 2)
    # --version and --help still work, and the help names the global options.
    v = memagent_cli("--version")
    assert v.returncode == 0 and v.stdout.startswith("memagent ")
    h = memagent_cli("-h")
    assert h.returncode == 0 and "--socket PATH" in h.stdout and "--json" in h.stdout


# --------------------------------------------------------------------------- errors as JSON


def test_errors_are_json_on_stdout_with_json(daemon: Daemon, make_target: Callable[..., Target],
                                             tmp_path: Path) -> None:
    nowhere = str(tmp_path / "none.sock")
    message = _error(memagent_cli("ls", "--json", "--socket", nowhere), "daemon-not-running", 2)
    assert message == f"no memagent daemon at {nowhere} (start one with: memagent daemon)"
    too_long = str(tmp_path / ("s" * 200))
    assert "too long" in _error(memagent_cli("status", "--json", "--socket", too_long), "cannot-connect", 2)
    _error(memagent_cli("attach", "--json", "--socket", daemon.socket, "not-a-pid"), "usage", 2)
    _error(memagent_cli("attach", "--json", "--socket", daemon.socket, "1", "--label", "a\nb"), "usage", 2)
    _error(memagent_cli("detach", "--json", "--socket", daemon.socket), "usage", 2)
    # A request about one PID that the daemon refuses: its code, and the PID.
    t = make_target()
    message = _error(memagent_cli("stack", str(t.pid), "--json", "--socket", daemon.socket),
                     "no_such_process", 1, pid=t.pid)
    assert str(t.pid) in message
    # Without --json, stdout stays empty: the line is on stderr only.
    r = memagent_cli("ls", "--socket", nowhere)
    assert (r.returncode, r.stdout, len(r.stderr.splitlines())) == (2, "", 1)


def test_per_pid_failures_in_json(daemon: Daemon, make_target: Callable[..., Target]) -> None:
    t = make_target()
    gone = _absent_pid()
    no_such = {"code": "no_such_process", "message": f"no such process: {gone}", "pid": gone}
    # Partial: what was done under the reply's name, the failures beside it.
    r = memagent_cli("attach", str(t.pid), str(gone), "--json", "--socket", daemon.socket)
    assert r.returncode == 1 and r.stderr == f"no such process: {gone}\n"
    doc = _json(r)
    assert isinstance(doc, dict) and set(doc) == {"attached", "failures"}
    assert [p["pid"] for p in doc["attached"]] == [t.pid]
    assert doc["failures"] == [no_such]
    # Nothing done: "error" is the first failure, "failures" all of them.
    r = memagent_cli("reset-peaks", str(gone), "--json", "--socket", daemon.socket)
    unwatched = {"code": "no_such_process", "message": f"no such process: {gone} (not watched)", "pid": gone}
    assert r.returncode == 1 and _json(r) == {"error": unwatched, "failures": [unwatched]}
    # Everything done: the array, as always.
    r = memagent_cli("detach", str(t.pid), "--json", "--socket", daemon.socket)
    assert r.returncode == 0 and [p["pid"] for p in _json(r)] == [t.pid]


# --------------------------------------------------------------------------- detach


def test_detach_says_not_watched_or_no_such_process(daemon: Daemon, make_target: Callable[..., Target]) -> None:
    live = make_target()  # exists, never attached
    gone = _absent_pid()
    r = memagent_cli("detach", str(live.pid), "--socket", daemon.socket)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"not watched: {live.pid}\n")
    r = memagent_cli("detach", str(gone), "--socket", daemon.socket)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"no such process: {gone}\n")
    r = memagent_cli("detach", str(live.pid), str(gone), "--json", "--socket", daemon.socket)
    assert r.returncode == 1 and _json(r) == {
        "error": {"code": "no_such_process", "message": f"not watched: {live.pid}", "pid": live.pid},
        "failures": [{"code": "no_such_process", "message": f"not watched: {live.pid}", "pid": live.pid},
                     {"code": "no_such_process", "message": f"no such process: {gone}", "pid": gone}],
    }
    # Watched, then detached: detached; once more: not watched any more.
    assert memagent_cli("attach", str(live.pid), "--socket", daemon.socket).returncode == 0
    r = memagent_cli("detach", str(live.pid), "--socket", daemon.socket)
    assert (r.returncode, r.stdout) == (0, f"detached {live.pid}\n")
    r = memagent_cli("detach", str(live.pid), "--socket", daemon.socket)
    assert (r.returncode, r.stderr) == (1, f"not watched: {live.pid}\n")


# --------------------------------------------------------------------------- status as a health check


def _budget_alert(c: Client, pred: Callable[[Alert], bool], frames: int = 600) -> Alert:
    for n, frame in enumerate(c.stream()):
        if isinstance(frame, AlertRaised) and frame.alert.kind == "budget" and pred(frame.alert):
            return frame.alert
        assert n < frames, "no such budget alert"
    raise AssertionError("stream ended")


def _status(d: Daemon) -> tuple[int, int, list[tuple[str, str]]]:
    text = memagent_cli("status", "--socket", d.socket)
    as_json = memagent_cli("--json", "status", "--socket", d.socket)
    assert text.returncode == as_json.returncode, (text, as_json)
    assert "Traceback" not in text.stderr + as_json.stderr and "error" not in _json(as_json), as_json
    alerts = [(a["kind"], a["severity"]) for a in _json(as_json)["alerts_active"]]
    return text.returncode, as_json.returncode, alerts


def test_status_exits_with_the_most_severe_alert_firing(start_daemon: Callable[..., Daemon],
                                                        make_target: Callable[..., Target], tmp_path: Path) -> None:
    # Only the budget can fire: no headroom (a capacity far above the targets), no
    # pressure, no leak. The label is trusted: given by root, or by the admin group.
    admin = "" if os.geteuid() == 0 else f'admin_group = "{os.getgid()}"\n'
    cfg = tmp_path / "memagent.toml"
    cfg.write_text(f'interval = 0.1\n{admin}[host]\ncapacity = "64GiB"\n'
                   '[alerts]\npressure_threshold = 100\nleak_min_rate = "1TiB"\n'
                   '[budgets]\nmodel = "200MiB"\n')
    d = start_daemon("--config", str(cfg))
    t = make_target()
    assert _status(d) == (0, 0, [])
    assert memagent_cli("attach", str(t.pid), "--label", "model", "--socket", d.socket).returncode == 0
    with d.client() as c:
        c.subscribe()
        t.do("alloc 210")  # Σ peaks of "model" ~ 1.1 x its budget: a warning
        _budget_alert(c, lambda a: a.state == "firing" and a.severity == "warning")
        assert _status(d) == (EXIT_WARNING, EXIT_WARNING, [("budget", "warning")])
        t.do("alloc 100")  # ~ 1.6 x: critical (from 1.25 x)
        _budget_alert(c, lambda a: a.severity == "critical")
        assert _status(d) == (EXIT_CRITICAL, EXIT_CRITICAL, [("budget", "critical")])
        assert memagent_cli("detach", str(t.pid), "--socket", d.socket).returncode == 0
        _budget_alert(c, lambda a: a.state == "resolved")
        assert _status(d) == (0, 0, [])
    h = memagent_cli("status", "--help")
    assert h.returncode == 0 and "4 a warning alert is" in h.stdout and "5 a critical" in h.stdout
