"""Issue 12 through the real command: ``memagent check-config FILE`` and ``memagent daemon
--config FILE`` refuse the same values, in one line naming the key and its line, never a
traceback; the daemon's flags go through the same checks (argparse usage errors, exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import memagent_cli

pytestmark = pytest.mark.e2e  # every test here starts processes (tests/tiers.py)

#: (file body, what the one line says after "FILE:LINE: ").
FILES = [
    ("interval = 5e-324\n", 1, "interval: out of range: 4.94066e-324 (from 0.01 to 60 seconds)"),
    ("interval = inf\n", 1, "interval: not a finite number: inf"),
    ("# refresh\nstatus_refresh = inf\n", 2, "status_refresh: not a finite number: inf"),
    ("[alerts]\nhook_timeout = 5\nrecent = inf\n", 3, "alerts.recent: not a finite number: inf"),
    ("history = 1e9\n", 1, "history: out of range: 1e+09 (from 1 to 86400 seconds)"),
    ("[host]\ncapacity = 12\n", 2, "host.capacity: 12 has no unit"),
    ('admin_group = "memagent-no-such-group"\n', 1, "admin_group: no such group: 'memagent-no-such-group'"),
    ('interval = 1\nsocket_group = "memagent-no-such-group"\n', 2, "socket_group: no such group"),
    ('[alerts]\nhook = ["/nonexistent/page-oncall"]\n', 2, "alerts.hook: no such program: '/nonexistent/page-oncall'"),
    ("intervall = 1\n", 1, "intervall: unknown key (did you mean 'interval'?)"),
    ("[alerts]\n\n\nwarn_fraction = 1.1\n", 4, "alerts.critical_fraction: must not be below alerts.warn_fraction"),
    ('"a\\nb" = 1\n', 1, "a\\nb: unknown key"),
]


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("body, line, said", FILES)
def test_check_config_and_the_daemon_refuse_the_same_file_in_one_line(
        tmp_path: Path, body: str, line: int, said: str) -> None:
    path = tmp_path / "m.toml"
    path.write_text(body)
    sock = tmp_path / "s.sock"
    checked = memagent_cli("check-config", str(path))
    assert checked.returncode == 2 and checked.stdout == ""
    assert one_line(checked.stderr).startswith(f"invalid: {path}:{line}: {said}")
    started = memagent_cli("daemon", "--config", str(path), "--socket", str(sock))
    assert started.returncode == 2
    assert one_line(started.stderr).startswith(f"memagent: invalid configuration: {path}:{line}: {said}")
    assert not sock.exists()


@pytest.mark.parametrize("raw, said", [
    (b"interval = 0.5\n\xff = 1\n", ":2: -: not UTF-8 text: byte 0xff"),
    (b"interval = 0.5\n[host\n", ":2: -: not valid TOML: "),
    (b"a = " + b"[" * 5000 + b"]" * 5000, ": -: not valid TOML: nested too deeply"),
])
def test_a_file_that_is_not_toml_text_is_one_line(tmp_path: Path, raw: bytes, said: str) -> None:
    path = tmp_path / "m.toml"
    path.write_bytes(raw)
    checked = memagent_cli("check-config", str(path))
    assert checked.returncode == 2 and one_line(checked.stderr).startswith(f"invalid: {path}{said}")
    started = memagent_cli("daemon", "--config", str(path), "--socket", str(tmp_path / "s.sock"))
    assert started.returncode == 2
    assert one_line(started.stderr).startswith(f"memagent: invalid configuration: {path}{said}")


def test_an_unreadable_file_is_one_line_whatever_its_name(tmp_path: Path) -> None:
    folder = tmp_path / "conf\nd"  # a newline in the path: still one line, escaped
    folder.mkdir()
    shown = str(folder).replace("\n", "\\n")
    checked = memagent_cli("check-config", str(folder))
    assert checked.returncode == 2
    assert one_line(checked.stderr) == f"invalid: {shown}: -: cannot read: Is a directory"
    started = memagent_cli("daemon", "--config", str(folder / "none.toml"), "--socket", str(tmp_path / "s.sock"))
    assert started.returncode == 2
    assert one_line(started.stderr) == (f"memagent: invalid configuration: {shown}/none.toml: -: "
                                        "cannot read: No such file or directory")


@pytest.mark.parametrize("args, said", [
    (["--interval", "nan"], "argument --interval: not a finite number: 'nan'"),
    (["--interval", "inf"], "argument --interval: not a finite number: 'inf'"),
    (["--interval", "abc"], "argument --interval: not a number: 'abc'"),
    (["--interval", "5e-324"], "argument --interval: out of range: 4.94066e-324 (from 0.01 to 60 seconds)"),
    (["--history", "1e9"], "argument --history: out of range: 1e+09 (from 1 to 86400 seconds)"),
    (["--status-refresh", "inf"], "argument --status-refresh: not a finite number: 'inf'"),
    (["--stack-budget", "0"], "argument --stack-budget: out of range: 0 (from 0.01 to 100 per second)"),
    (["--stack-timeout", "-1"], "argument --stack-timeout: out of range: -1 (from 0.1 to 60 seconds)"),
    (["--admin-group", "memagent-no-such-group"], "argument --admin-group: no such group: 'memagent-no-such-group'"),
    (["--socket-group", "memagent-no-such-group"], "argument --socket-group: no such group: 'memagent-no-such-group'"),
    (["--auto-label", ""], "argument --auto-label/--label: a label cannot be empty"),
])
def test_a_flag_goes_through_the_check_of_its_key(tmp_path: Path, args: list[str], said: str) -> None:
    sock = tmp_path / "s.sock"
    r = memagent_cli("daemon", "--socket", str(sock), *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "invalid" not in r.stderr
    assert r.stderr.splitlines() == [f"memagent daemon: {said} (see: memagent daemon --help)"]  # one line
    assert not sock.exists()
