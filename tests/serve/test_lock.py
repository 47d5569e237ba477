"""One daemon per socket path (issue 12): the lock beside the socket (``lock_daemon``),
which a deleted socket file does not release and another user cannot take first or hold.

The end-to-end case (a second real daemon refused after the first's socket file was
deleted) is ``tests/e2e/test_daemon_faults.py``."""

from __future__ import annotations

import fcntl
import os
import pwd
import stat
from pathlib import Path

import pytest
from conftest import as_user

from memagent.errors import DaemonAlreadyRunning, SocketPathError
from memagent.serve.listen import LOCK_MODE, lock_daemon


def test_the_lock_is_held_until_released_and_leaves_nothing_behind(tmp_path: Path) -> None:
    path = str(tmp_path / "run" / "m.sock")  # no socket file at all: the lock alone decides
    lock = lock_daemon(path, None)
    try:
        with pytest.raises(DaemonAlreadyRunning, match="already listening on"):
            lock_daemon(path, None)
        assert os.path.exists(lock.path), "the refused one must not remove the holder's lock file"
        st = os.lstat(lock.path)
        assert lock.path == path + ".lock" and stat.S_ISREG(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == LOCK_MODE and st.st_uid == os.geteuid()
        assert fcntl.fcntl(lock.fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC, "py-spy and the hook would inherit it"
    finally:
        lock.release()
    assert not os.path.exists(path + ".lock")
    again = lock_daemon(path, None)
    again.release()


def test_a_lock_file_left_by_a_killed_daemon_is_taken_over(tmp_path: Path) -> None:
    """SIGKILL leaves the file but not the lock (the kernel drops it): a new daemon starts."""
    path = str(tmp_path / "m.sock")
    Path(path + ".lock").write_bytes(b"")
    os.chmod(path + ".lock", 0o644)
    lock = lock_daemon(path, None)
    try:
        assert stat.S_IMODE(os.fstat(lock.fd).st_mode) == LOCK_MODE
    finally:
        lock.release()


def test_a_link_at_the_lock_path_is_refused_and_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    victim.chmod(0o644)
    path = str(tmp_path / "m.sock")
    os.symlink(victim, path + ".lock")
    with pytest.raises(SocketPathError, match=r"cannot open the lock file .*; not using it"):
        lock_daemon(path, None)
    assert victim.read_text() == "keep" and stat.S_IMODE(victim.stat().st_mode) == 0o644


def test_a_lock_file_another_user_planted_in_a_sticky_directory_is_refused(tmp_path: Path) -> None:
    """In a sticky directory (``/tmp``-like) anyone may create the name first: a file that
    is not ours is refused, as a squatter's socket is, never used (its owner could hold it)."""
    if os.geteuid() != 0:
        pytest.skip("planting another user's file needs root")
    shared = tmp_path / "sticky"
    shared.mkdir()
    shared.chmod(0o1777)
    path = str(shared / "m.sock")
    Path(path + ".lock").write_bytes(b"")
    os.chown(path + ".lock", 65534, 65534)
    # (Where fs.protected_regular is set, the kernel already refuses the open itself.)
    refused = r"lock file .*(not a regular file of ours .*uid 65534|Permission denied)"
    with pytest.raises(SocketPathError, match=refused):
        lock_daemon(path, None)


def test_another_user_cannot_open_the_lock_to_hold_it(test_user: pwd.struct_passwd, shared_dir: str) -> None:
    """0600: only the daemon's user may open the file, so only it may flock it."""
    lock = lock_daemon(os.path.join(shared_dir, "m.sock"), None)
    try:
        def try_to_hold() -> str:
            try:
                fd = os.open(lock.path, os.O_RDONLY)
            except PermissionError:
                return "denied"
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return "held"

        assert as_user(test_user, try_to_hold) == "denied"
    finally:
        lock.release()
