"""How a client finds the daemon (issue 13): ``--socket``, else ``$MEMAGENT_SOCKET``, else
the system socket ``/run/memagent/memagent.sock`` whoever the client is, then the per-user
paths. Played for real: root's daemons (one on the system socket, in ``/run/memagent`` as
the unit's ``RuntimeDirectory=`` makes it), and the real ``memagent`` CLI run as the second
user with no flags and an empty environment (a forked child that drops root's
credentials: the venv's interpreter is not reachable by that user)."""

from __future__ import annotations

import contextlib
import grp
import io
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import TEST_USER, Daemon, as_user
from test_security_socket import FAKE, SYSTEM_PYTHON

from memagent.cli.main import main
from memagent.client import connect
from memproto.client_side import DaemonTimeout
from memproto.paths import SYSTEM_SOCKET, fallback_socket

RUN_DIR = os.path.dirname(SYSTEM_SOCKET)
NO_DAEMON = "(start one with: memagent daemon)"

#: A listener that is not root's on the system socket: root binds it, the test user's
#: process (system python, stdlib only) listens on the inherited descriptor, so the
#: kernel's SO_PEERCRED names the test user, and serves FAKE to every connection.
SQUATTER = """
import socket, sys
s = socket.socket(fileno=int(sys.argv[2]))
s.listen(8)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    try:
        c.sendall(bytes.fromhex(sys.argv[1]))
        c.settimeout(5)
        while c.recv(65536):
            pass
    except OSError:
        pass
    c.close()
"""


def _answers(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


@pytest.fixture
def no_system_daemon() -> None:
    """Nothing of this box's own on the system socket (skip where something answers)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    if _answers(SYSTEM_SOCKET):
        pytest.skip(f"{SYSTEM_SOCKET} is in use on this box")


@pytest.fixture
def run_dir(no_system_daemon: None) -> Iterator[str]:
    """``/run/memagent`` as systemd makes it for the unit (root's, 0755); what the test made
    there is removed afterwards, what was there before is left alone."""
    if os.path.lexists(SYSTEM_SOCKET) and not stat.S_ISSOCK(os.lstat(SYSTEM_SOCKET).st_mode):
        pytest.skip(f"{SYSTEM_SOCKET} is something else than a socket on this box")
    made = not os.path.lexists(RUN_DIR)
    lock = SYSTEM_SOCKET + ".lock"
    had_lock = os.path.lexists(lock)
    if made:
        os.mkdir(RUN_DIR, 0o755)
        os.chmod(RUN_DIR, 0o755)
    try:
        yield RUN_DIR
    finally:
        if not had_lock:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock)
        if made:
            with contextlib.suppress(OSError):
                os.rmdir(RUN_DIR)


@pytest.fixture
def system_daemon(run_dir: str, start_daemon: Callable[..., Daemon]) -> Callable[..., Daemon]:
    """Start a root daemon on the system socket (the unit's command line, its group given)."""

    def start(*args: str) -> Daemon:
        return start_daemon("--interval", "0.5", *args, socket=SYSTEM_SOCKET)

    return start


def cli_as(user: pwd.struct_passwd, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``memagent ARGS`` as ``user`` (its primary group only), in exactly ``env`` (default:
    empty): exit code, stdout, stderr."""
    tempfile.gettempdir()  # the fallback's <tmp>, decided here as for the expectations

    def run() -> list[object]:
        os.environ.clear()
        os.environ.update(env or {})
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
        return [code, out.getvalue(), err.getvalue()]

    code, out, err = as_user(user, run)  # type: ignore[misc]
    return code, out, err


def served_by(user: pwd.struct_passwd, *args: str, env: dict[str, str] | None = None) -> str:
    """The socket of the daemon ``memagent status --json ARGS`` reached as ``user``."""
    code, out, err = cli_as(user, "status", "--json", *args, env=env)
    assert code == 0, (out, err)
    return str(json.loads(out)["socket"])


# --------------------------------------------------------------------------- the system daemon, found


def test_a_user_with_no_flags_and_no_environment_finds_the_system_daemon(
    test_user: pwd.struct_passwd, system_daemon: Callable[..., Daemon]
) -> None:
    """The issue: the unit's daemon, its socket group the user's, and a user's ``memagent
    ls`` with nothing set: it talks to that daemon (before, it looked only per user)."""
    d = system_daemon("--socket-group", TEST_USER)
    assert stat.S_IMODE(os.stat(RUN_DIR).st_mode) == 0o755
    code, out, err = cli_as(test_user, "ls", "--json")
    assert (code, out, err) == (0, "[]\n", "")
    assert served_by(test_user) == SYSTEM_SOCKET
    with d.client() as c:
        assert c.status().socket == SYSTEM_SOCKET


def test_explicit_paths_beat_the_system_socket_and_are_never_replaced(
    test_user: pwd.struct_passwd, system_daemon: Callable[..., Daemon], start_daemon: Callable[..., Daemon],
    shared_dir: str,
) -> None:
    """``$MEMAGENT_SOCKET`` beats the system socket, ``--socket`` beats both; an explicit path
    with no daemon is that path's error, not a silent switch to the system daemon."""
    system_daemon("--socket-group", TEST_USER)
    a = start_daemon("--interval", "0.5", "--socket-group", TEST_USER, socket=os.path.join(shared_dir, "a.sock"))
    b = start_daemon("--interval", "0.5", "--socket-group", TEST_USER, socket=os.path.join(shared_dir, "b.sock"))
    assert served_by(test_user) == SYSTEM_SOCKET
    assert served_by(test_user, env={"MEMAGENT_SOCKET": a.socket}) == a.socket
    assert served_by(test_user, "--socket", b.socket, env={"MEMAGENT_SOCKET": a.socket}) == b.socket
    assert served_by(test_user, "--socket", b.socket) == b.socket
    nowhere = os.path.join(shared_dir, "nobody.sock")
    for args, env in (((), {"MEMAGENT_SOCKET": nowhere}), (("--socket", nowhere), {})):
        assert cli_as(test_user, "ls", *args, env=env) == (2, "", f"no memagent daemon at {nowhere} {NO_DAEMON}\n")


# --------------------------------------------------------------------------- nothing answers


def test_no_daemon_anywhere_is_one_line_naming_every_path_tried(
    test_user: pwd.struct_passwd, no_system_daemon: None, shared_dir: str
) -> None:
    runtime = os.path.join(shared_dir, "runtime")
    tried = f"{SYSTEM_SOCKET}, {runtime}/memagent.sock or {fallback_socket(test_user.pw_uid)}"
    code, out, err = cli_as(test_user, "ls", env={"XDG_RUNTIME_DIR": runtime})
    assert (code, out, err) == (2, "", f"no memagent daemon at {tried} {NO_DAEMON}\n")
    code, out, err = cli_as(test_user, "status", "--json")
    message = f"no memagent daemon at {SYSTEM_SOCKET} or {fallback_socket(test_user.pw_uid)} {NO_DAEMON}"
    assert (code, err) == (2, message + "\n")
    assert json.loads(out) == {"error": {"code": "daemon-not-running", "message": message, "pid": None}}


def test_a_system_socket_the_user_may_not_use_is_passed_over_and_named(
    test_user: pwd.struct_passwd, system_daemon: Callable[..., Daemon], start_daemon: Callable[..., Daemon],
    shared_dir: str,
) -> None:
    """The system daemon without the user's group (0660 root:root): the user's own path is
    tried next and answers; with nothing there either, one line says both, exit 2."""
    system_daemon()
    user = start_daemon("--interval", "0.5", "--socket-group", TEST_USER,
                        socket=os.path.join(shared_dir, "memagent.sock"))
    assert served_by(test_user, env={"XDG_RUNTIME_DIR": shared_dir}) == user.socket
    user.stop()
    code, out, err = cli_as(test_user, "ls", "--json", env={"XDG_RUNTIME_DIR": shared_dir})
    message = (f"cannot connect to {SYSTEM_SOCKET}: Permission denied; no memagent daemon at "
               f"{user.socket} or {fallback_socket(test_user.pw_uid)}")
    assert (code, err) == (2, f"memagent: {message}\n")
    assert json.loads(out) == {"error": {"code": "cannot-connect", "message": message, "pid": None}}


# --------------------------------------------------------------------------- trust


def test_the_system_socket_is_trusted_only_when_root_serves_it(
    test_user: pwd.struct_passwd, run_dir: str, shared_dir: str
) -> None:
    """Another user's listener on the system socket: a user's client refuses it (its UID
    is neither root nor the client's), exit 1, and does not go on to another path; with
    ``$MEMAGENT_DAEMON_UID`` naming that user, it is talked to."""
    try:
        victim = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' to play the victim")
    if shutil.which("setpriv") is None or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("needs setpriv and the system python3")
    if os.path.lexists(SYSTEM_SOCKET):
        os.unlink(SYSTEM_SOCKET)  # a stale socket (run_dir checked that nobody answers)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(SYSTEM_SOCKET)
    os.chmod(SYSTEM_SOCKET, 0o666)
    proc = subprocess.Popen(
        ["setpriv", f"--reuid={test_user.pw_uid}", f"--regid={test_user.pw_gid}", "--clear-groups",
         SYSTEM_PYTHON, "-c", SQUATTER, FAKE.hex(), str(sock.fileno())],
        stdout=subprocess.PIPE, text=True, cwd="/", pass_fds=[sock.fileno()],
    )
    sock.close()
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        env = {"XDG_RUNTIME_DIR": shared_dir}
        code, out, err = cli_as(victim, "ls", env=env)
        assert (code, out) == (1, "")
        assert err == (f"memagent: refusing the daemon at {SYSTEM_SOCKET}: it runs as uid {test_user.pw_uid} "
                       f"(trusted: root, uid {victim.pw_uid}); set MEMAGENT_DAEMON_UID to trust another owner\n")
        code, out, err = cli_as(victim, "ls", env={**env, "MEMAGENT_DAEMON_UID": TEST_USER})
        assert code == 0 and "4242  FAKE" in out, (out, err)
    finally:
        proc.kill()
        proc.wait()
        os.unlink(SYSTEM_SOCKET)


def test_a_listener_that_does_not_answer_ends_the_search_naming_its_path(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """Something accepts on the first path but says nothing: the client reports that path
    (a timeout, exit 1 in the CLI), not the daemon on the next path behind it."""
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = str(tmp_path / "mute.sock")
    mute.bind(path)
    mute.listen(1)  # the kernel completes the connect; nobody ever reads or writes
    d = start_daemon("--interval", "0.5")
    try:
        with pytest.raises(DaemonTimeout) as exc:
            connect(timeout=0.3, candidates=[path, d.socket])
        assert str(exc.value) == f"no answer in time from the daemon at {path}"
        assert exc.value.code == "timeout" and isinstance(exc.value, TimeoutError)
        with connect(timeout=5, candidates=[str(tmp_path / "none.sock"), d.socket]) as c:
            assert c.path == d.socket
    finally:
        mute.close()


def test_a_socket_of_another_group_says_which_group_and_how_to_join_it(
    test_user: pwd.struct_passwd, system_daemon: Callable[..., Daemon]
) -> None:
    """A user outside the socket's group is told the group and the command that adds them
    (issue 28: "Permission denied" alone, and nothing said "ask to be added to group ...")."""
    try:
        group = grp.getgrnam("daemon")
    except KeyError:
        pytest.skip("no group 'daemon' to give the socket")
    assert test_user.pw_name not in group.gr_mem
    system_daemon("--socket-group", group.gr_name)
    code, _, err = cli_as(test_user, "ls")
    assert code == 2, err
    assert (f"cannot connect to {SYSTEM_SOCKET}: Permission denied: connecting takes group {group.gr_name} "
            f"(an administrator adds you with: usermod -aG {group.gr_name} {test_user.pw_name}; then log in "
            "again)") in err, err
