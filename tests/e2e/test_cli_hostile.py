"""Every ``memagent`` command fed hostile arguments, against a real daemon: never a
traceback, only documented exit codes, and every failure one printable line on stderr (and,
with ``--json``, one error object on stdout). The daemon command gets one sanity case (its
flags' values are checked by the configuration's rules, tests/test_config.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import Daemon

#: What a hostile command line may end with (docs/cli.md): 0 done, 1 failed, 2 no daemon
#: or usage. (4 and 5, alerts firing, cannot happen here: the daemon watches nothing big.)
DOCUMENTED = {0, 1, 2}

#: Each run costs a Python start (~0.15 s of CPU): one value per kind of trouble.
HOSTILE = [
    "99999999999999999999", "4194305", "-1", "0", "+5", "0x10", "nan", "", " \t", "\x1b[31mred\x1b[0m", "a\nb",
    "\u202eevil", "ünïcödé", "-", "--", "--json=1", "--socket", "x" * 5000,
]

#: How each command takes an argument (``H`` stands for the hostile value).
SHAPES: dict[str, list[list[str]]] = {
    "attach": [["H", "1"], ["--label", "H", "1"]],
    "detach": [["--exited", "H"]],
    "reset-peaks": [["--kernel", "H"]],
    "ls": [["H"]],
    "stack": [["H", "--cached"]],
    "status": [["H"]],
}


def run(argv: Sequence[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memagent.cli", *argv], capture_output=True, text=True,
                          timeout=60, env=env, errors="backslashreplace")


def check(argv: Sequence[str], r: subprocess.CompletedProcess[str]) -> None:
    """The contract for any command line at all."""
    what = f"memagent {' '.join(map(repr, argv))[:300]} -> {r.returncode}\nstdout: {r.stdout[:500]!r}\n" \
           f"stderr: {r.stderr[:1000]!r}"
    assert "Traceback" not in r.stdout + r.stderr, what
    assert r.returncode in DOCUMENTED, what
    assert "unexpected" not in r.stderr, what  # main's last resort: a bug
    if r.returncode == 0:
        assert r.stderr == "", what
    else:
        assert len(r.stderr.splitlines()) == 1 and r.stderr.endswith("\n"), what
        assert r.stderr[:-1].isprintable(), what  # escaped: no raw escape, newline, bidi override
    if "--json" in argv and r.returncode != 0 and "--" not in argv:
        doc = json.loads(r.stdout) if r.stdout.count("\n") == 1 else None
        assert isinstance(doc, dict) and ("error" in doc or "failures" in doc), what  # failures: a partial success
        errors = [doc["error"]] if "error" in doc else []
        for e in errors + doc.get("failures", []):
            assert set(e) == {"code", "message", "pid"} and isinstance(e["code"], str), what


def run_all(cases: list[list[str]], env: dict[str, str]) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        for argv, r in zip(cases, pool.map(lambda argv: run(argv, env), cases), strict=True):
            check(argv, r)


@pytest.fixture
def env(daemon: Daemon) -> dict[str, str]:
    """The test daemon is the default socket: a command without --socket talks to it too."""
    return {**os.environ, "MEMAGENT_SOCKET": daemon.socket}


@pytest.fixture
def no_daemon_env(tmp_path: Path) -> dict[str, str]:
    """No daemon at the default socket (never the box's own daemon)."""
    return {**os.environ, "MEMAGENT_SOCKET": str(tmp_path / "no-daemon.sock")}


@pytest.mark.parametrize("command", sorted(SHAPES))
def test_hostile_arguments(command: str, daemon: Daemon, env: dict[str, str]) -> None:
    cases = []
    for shape in SHAPES[command]:
        for n, value in enumerate(HOSTILE):  # every other one with --json, before or after
            argv = [command, *(value if part == "H" else part for part in shape)]
            cases.append(argv if n % 2 else (["--json", *argv] if n % 4 else [*argv, "--json"]))
    run_all(cases, env)


def _socket_paths(tmp: Path) -> list[str]:
    regular = tmp / "regular-file"
    regular.write_text("not a socket\n")
    directory = tmp / "a-directory"
    directory.mkdir()
    return [
        "", str(tmp / ("s" * 200)), "/" + "d" * 300, str(tmp / "nonexistent.sock"), str(regular), str(directory),
        str(regular / "below-a-file.sock"), str(tmp / "esc\x1b[2J.sock"), "relative/none.sock", "-",
    ]


def test_hostile_sockets(tmp_path: Path, no_daemon_env: dict[str, str]) -> None:
    """Whatever the socket path, before or after the command: exit 2, one line."""
    cases, commands = [], sorted(SHAPES)
    for n, path in enumerate(_socket_paths(tmp_path)):  # each path after and before, each command in turn
        for m, command in enumerate((commands[n % len(commands)], commands[(n + 1) % len(commands)])):
            argv = [command, *(["1"] if command in ("attach", "detach", "reset-peaks", "stack") else [])]
            cases.append([*argv, "--socket", path] if m else ["--socket", path, *argv, "--json"])
    with ThreadPoolExecutor(max_workers=4) as pool:
        for case, r in zip(cases, pool.map(lambda argv: run(argv, no_daemon_env), cases), strict=True):
            check(case, r)
            assert r.returncode == 2, (case, r)
            if "--json" in case:
                code = json.loads(r.stdout)["error"]["code"]
                assert code in ("usage", "daemon-not-running", "cannot-connect"), (case, r)


def test_hostile_top_level_and_other_commands(tmp_path: Path, no_daemon_env: dict[str, str]) -> None:
    """The top level, check-config, demo (only what it refuses before starting) and one
    daemon case."""
    cases: list[list[str]] = [[], ["--json"], ["--socket"], ["--socket", "x"], ["--json", "--socket", "x"]]
    for n, value in enumerate(HOSTILE):
        cases += [[value], ["--json", value, "ls"] if n % 2 else [value, "ls"]]
        cases.append(["check-config", value] if n % 2 else ["check-config", "--json", value])
        if not _positive_finite(value):
            cases.append(["demo", "--seconds", value])
        if value != "--":  # ``demo --`` is a demo without end
            cases.append(["demo", value])
    cases += [["check-config", str(tmp_path)], ["check-config", "/dev/null"], ["check-config"],
              ["check-config", str(tmp_path / "missing.toml")]]
    regular = tmp_path / "file"
    regular.write_text("")
    cases.append(["daemon", "--socket", str(regular)])  # not a socket: refused, one line, exit 1
    cases.append(["demo", "--socket", str(regular), "--seconds", "30"])  # the same, at once (it used to hang)
    run_all(cases, no_daemon_env)


def _positive_finite(value: str) -> bool:
    try:
        x = float(value)
    except ValueError:
        return False
    return math.isfinite(x) and x > 0
