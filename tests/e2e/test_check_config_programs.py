"""``memagent check-config`` on ``[stacks] py_spy`` and ``[stacks] austin`` (docs/security.md
section 14): a path that exists must be a regular, executable file, else a one-line error
naming the key (exit 2), as the daemon refuses it; a path that does not exist is the
daemon's "not found" at start (py_spy_missing), as before. The non-executable file here
is the second user's own, in a directory it may write, as a planted program would be."""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import as_user, memagent_cli


@pytest.fixture
def planted(test_user: pwd.struct_passwd, shared_dir: str) -> Iterator[Path]:
    """A non-executable file and a directory, both made by the second user."""
    os.chown(shared_dir, test_user.pw_uid, test_user.pw_gid)

    def plant() -> dict[str, str]:
        (Path(shared_dir) / "py-spy").write_text("#!/bin/sh\nexit 0\n")  # mode 644: not executable
        (Path(shared_dir) / "austin").mkdir()
        return {"ok": "planted"}

    assert as_user(test_user, plant) == {"ok": "planted"}
    yield Path(shared_dir)


def _check(tmp_path: Path, body: str) -> tuple[int, str]:
    conf = tmp_path / "memagent.toml"
    conf.write_text(body)
    r = memagent_cli("check-config", str(conf))
    return r.returncode, r.stderr.strip()


@pytest.mark.parametrize("key, name, problem", [
    ("py_spy", "py-spy", "not executable"),
    ("austin", "austin", "not a regular file"),
])
def test_a_program_that_cannot_run_is_refused(tmp_path: Path, planted: Path, key: str, name: str,
                                              problem: str) -> None:
    rc, err = _check(tmp_path, f'[stacks]\n{key} = "{planted / name}"\n')
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"stacks.{key}" in err and problem in err and "Traceback" not in err


def test_an_executable_program_and_a_missing_one_are_valid(tmp_path: Path) -> None:
    program = tmp_path / "py-spy"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(stat.S_IRWXU)
    rc, err = _check(tmp_path, f'[stacks]\npy_spy = "{program}"\naustin = "/nonexistent/austin"\n')
    assert rc == 0, err


def test_the_daemon_refuses_it_too(tmp_path: Path, planted: Path) -> None:
    r = memagent_cli("daemon", "--socket", str(tmp_path / "s.sock"), "--py-spy", str(planted / "py-spy"))
    assert r.returncode == 2 and "not executable" in r.stderr and "Traceback" not in r.stderr
