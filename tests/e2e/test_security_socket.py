"""The socket's trust, attacked: a directory another user planted or can write, a link
swapped in at the socket's path, a squatter serving fake data on the path. Each attack is
played for real, by a second user (``memagent-test``, and ``nobody`` where a third identity
is needed), and each test asserts that it fails."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import TEST_USER, Daemon, as_user, memagent_cli

from memagent.client import Client
from memagent.errors import DaemonAlreadyRunning, SocketPathError
from memagent.serve.listen import bind_socket
from memproto import PROTOCOL_VERSION, encode, frame_bytes
from memproto.client_side import UntrustedDaemon, check_server_uid, trusted_uids
from memproto.frames import Hello, ListOk
from memproto.paths import socket_path
from memproto.records import ProcessInfo
from memtop.link import Connector
from memtop.messages import LinkDown, LinkUp

SYSTEM_PYTHON = "/usr/bin/python3"

#: What a squatter serves: a valid daemon hello, then the reply to the first request
#: (``memagent ls`` sends ``list`` with id 1) listing a process that does not exist.
FAKE = frame_bytes(encode(Hello(list(PROTOCOL_VERSION), "server", "fake-daemon", 1.0, 4242))) + frame_bytes(
    encode(ListOk(1, [ProcessInfo(pid=4242, start_time=1.0, name="FAKE-PROCESS", cmdline=["fake"], label="FAKE",
                                  uid=0, alive=True, attached_at=1.0, exited_at=None, rss_bytes=1,
                                  rss_peak_bytes=1, anon_bytes=1, swap_bytes=0)])))

#: The squatter, run by the system python (stdlib only) as another user: it serves FAKE
#: to every connection on argv[2].
SQUATTER = """
import os, socket, sys
blob, path = bytes.fromhex(sys.argv[1]), sys.argv[2]
os.umask(0)  # anyone may connect: it wants victims
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(8)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.settimeout(5)
    try:
        c.sendall(blob)
        while c.recv(65536):
            pass
    except OSError:
        pass
    c.close()
"""


# --------------------------------------------------------------------------- users (as in test_identity_and_access)


@pytest.fixture(scope="module")
def third_user(test_user: pwd.struct_passwd) -> pwd.struct_passwd:
    """A third identity, neither root nor the test user: the attacker of the test user."""
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' to play a third identity")


@pytest.fixture
def user_dir(test_user: pwd.struct_passwd) -> Iterator[str]:
    """A directory of the test user's (0755): where it can put sockets root can reach."""
    path = tempfile.mkdtemp(prefix="memagent-usr-", dir="/tmp")
    os.chown(path, test_user.pw_uid, test_user.pw_gid)
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _squatter(user: pwd.struct_passwd, path: str) -> Iterator[None]:
    """The user's own listener on ``path``: a separate process (setpriv, system python)."""
    if shutil.which("setpriv") is None or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("needs setpriv and the system python3")
    proc = subprocess.Popen(
        ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
         SYSTEM_PYTHON, "-c", SQUATTER, FAKE.hex(), path],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "ready", proc.communicate(timeout=5)
        yield
    finally:
        proc.kill()
        proc.wait()


def _exit_code(d: Daemon) -> int:
    """The exit code of a daemon expected to exit by itself (its log then complete)."""
    d.proc.wait(15)
    return d.stop()


def _fallback_dir(user: pwd.struct_passwd) -> str:
    return os.path.join(tempfile.gettempdir(), f"memagent-{user.pw_uid}")


def _remove(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------- the fallback directory, planted


@pytest.mark.parametrize("plant", ["attackers_dir_0777", "attackers_symlink", "world_writable_root_dir"])
def test_planted_fallback_directory_is_refused_and_the_squatter_not_used(
    plant: str, test_user: pwd.struct_passwd, third_user: pwd.struct_passwd
) -> None:
    """The issue's attack: with no XDG_RUNTIME_DIR, another user made /tmp/memagent-UID
    first. The victim's daemon must not use it; the victim's client must not talk to the
    attacker's listener there."""
    victim, attacker = test_user, third_user
    directory = _fallback_dir(victim)
    _remove(directory)
    decoy = tempfile.mkdtemp(prefix="memagent-decoy-", dir="/tmp")  # a real directory of the victim's
    os.chown(decoy, victim.pw_uid, victim.pw_gid)
    try:
        if plant == "attackers_dir_0777":
            def make() -> None:
                os.mkdir(directory)
                os.chmod(directory, 0o777)
            as_user(attacker, make)
            expected = (f"socket directory {directory} is owned by uid {attacker.pw_uid}, "
                        f"not by uid {victim.pw_uid} or root")
        elif plant == "attackers_symlink":  # to a directory of the victim's own: it would pass every check
            as_user(attacker, lambda: os.symlink(decoy, directory))
            expected = f"socket directory {directory} is a symbolic link of uid {attacker.pw_uid}"
        else:
            os.mkdir(directory)
            os.chmod(directory, 0o777)
            expected = f"socket directory {directory} is writable by group or others (mode 0777) and not sticky"

        def victim_daemon() -> dict[str, object]:
            os.environ.pop("XDG_RUNTIME_DIR", None)
            os.environ.pop("MEMAGENT_SOCKET", None)
            path = socket_path()
            try:
                sock, _ = bind_socket(path, None)
            except SocketPathError as exc:
                return {"path": path, "refused": str(exc), "type": type(exc).__name__}
            sock.close()
            return {"path": path, "bound": True}

        out = as_user(victim, victim_daemon)
        assert out["path"] == os.path.join(directory, "memagent.sock")
        assert out.get("type") == "SocketPathError" and out["refused"].startswith(expected), out
        assert not os.path.lexists(os.path.join(decoy, "memagent.sock"))

        if plant == "attackers_dir_0777":  # the attacker now listens there: the victim's client refuses
            with _squatter(attacker, out["path"]):
                def victim_client() -> str:
                    try:
                        Client(out["path"]).close()
                    except UntrustedDaemon as exc:
                        return str(exc)
                    return "talked to the squatter"

                message = as_user(victim, victim_client)
            assert message.startswith(f"refusing the daemon at {out['path']}: it runs as uid {attacker.pw_uid} "
                                      f"(trusted: root, uid {victim.pw_uid})"), message
    finally:
        _remove(directory)
        shutil.rmtree(decoy, ignore_errors=True)


@pytest.mark.parametrize("plant", ["other_users_dir", "world_writable_dir", "other_users_symlink",
                                   "under_other_users_dir"])
def test_daemon_refuses_a_directory_another_user_controls(
    plant: str, test_user: pwd.struct_passwd, user_dir: str, shared_dir: str,
    start_daemon: Callable[..., Daemon], tmp_path: Path,
) -> None:
    """Root's daemon told to listen where another user could swap the socket: it exits 1
    naming the directory, and creates nothing there."""
    uid = test_user.pw_uid
    if plant == "other_users_dir":
        directory, why = user_dir, f"socket directory {user_dir} is owned by uid {uid}, not by root"
    elif plant == "world_writable_dir":
        os.chmod(shared_dir, 0o777)
        directory, why = shared_dir, f"socket directory {shared_dir} is writable by group or others (mode 0777)"
    elif plant == "other_users_symlink":  # in a sticky directory, the user's link to a good root directory
        os.chmod(shared_dir, 0o1777)
        directory = os.path.join(shared_dir, "link")
        as_user(test_user, lambda: os.symlink(tmp_path, directory))
        why = f"socket directory {directory} is a symbolic link of uid {uid}"
    else:  # a root directory inside the user's: the user can rename it away and plant another
        directory = os.path.join(user_dir, "sub")
        os.mkdir(directory, 0o755)
        why = f"socket directory {user_dir} is owned by uid {uid}, not by root"
    path = os.path.join(directory, "m.sock")
    d = start_daemon("--interval", "0.5", socket=path, wait=False)
    assert _exit_code(d) == 1
    assert f"memagent: cannot listen on {path}: {why}" in d.log, d.log
    assert not os.path.lexists(path)
    assert not any(os.path.lexists(os.path.join(p, "m.sock")) for p in (shared_dir, tmp_path))


def test_daemon_accepts_sticky_and_root_linked_directories(
    shared_dir: str, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """What must keep working: a sticky world-writable directory (like /tmp), a link made
    by root, and a missing directory, which root's daemon creates 0755 (the system path)."""
    os.chmod(shared_dir, 0o1777)
    d = start_daemon("--interval", "0.5", socket=os.path.join(shared_dir, "m.sock"))
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    d2 = start_daemon("--interval", "0.5", socket=str(link / "new" / "m.sock"))
    for daemon in (d, d2):
        with daemon.client() as c:
            assert c.server_hello.role == "server"
    assert stat.S_IMODE(os.lstat(tmp_path / "real" / "new").st_mode) == 0o755 & ~_umask()
    assert stat.S_IMODE(os.lstat(tmp_path / "real").st_mode) == 0o755 & ~_umask()


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_fallback_directory_is_created_private(test_user: pwd.struct_passwd) -> None:
    """The per-user fallback directory a daemon creates is its own and 0700."""
    directory = _fallback_dir(test_user)
    _remove(directory)

    def victim_daemon() -> list[int]:
        os.environ.pop("XDG_RUNTIME_DIR", None)
        os.environ.pop("MEMAGENT_SOCKET", None)
        os.umask(0)  # not even a lax umask widens it
        sock, _ = bind_socket(socket_path(), None)
        sock.close()
        st = os.lstat(directory)
        sst = os.lstat(os.path.join(directory, "memagent.sock"))
        return [st.st_uid, stat.S_IMODE(st.st_mode), sst.st_uid, stat.S_IMODE(sst.st_mode)]

    try:
        assert as_user(test_user, victim_daemon) == [test_user.pw_uid, 0o700, test_user.pw_uid, 0o660]
    finally:
        _remove(directory)


def test_stale_socket_of_another_user_is_not_replaced(
    test_user: pwd.struct_passwd, shared_dir: str, start_daemon: Callable[..., Daemon]
) -> None:
    os.chmod(shared_dir, 0o1777)
    path = os.path.join(shared_dir, "m.sock")

    def leave_stale() -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)
        s.close()

    as_user(test_user, leave_stale)
    d = start_daemon("--interval", "0.5", socket=path, wait=False)
    assert _exit_code(d) == 1
    assert f"{path} is a stale socket of uid {test_user.pw_uid}; not replacing it" in d.log, d.log
    assert os.lstat(path).st_uid == test_user.pw_uid


# --------------------------------------------------------------------------- links at the socket's path


def _victim_file(directory: Path, user: pwd.struct_passwd) -> Path:
    victim = directory / "victim-secret"
    victim.write_text("secret\n")
    os.chown(victim, user.pw_uid, user.pw_gid)
    os.chmod(victim, 0o600)
    return victim


def _swapper(path: str, victim: Path, stop_fd: int) -> int:
    """A process that, until ``stop_fd`` is readable, keeps replacing whatever sits at
    ``path`` with a link to ``victim``: the issue's race, run for real and continuously."""
    child = os.fork()
    if child == 0:
        os.set_blocking(stop_fd, False)
        while True:
            try:
                if os.read(stop_fd, 1):
                    os._exit(0)
            except BlockingIOError:
                pass
            with contextlib.suppress(OSError):
                os.rename(path, path + ".moved")
            with contextlib.suppress(OSError):
                os.symlink(victim, path)
            with contextlib.suppress(OSError):
                os.unlink(path)
    return child


def test_link_swapped_in_after_bind_is_never_followed(test_user: pwd.struct_passwd, tmp_path: Path) -> None:
    """Another process swaps the socket path for a link to a victim's 0600 file as fast as
    it can while the daemon binds, again and again: the victim's file never changes mode
    or group (the mode is set on the socket before bind, the group without following a
    link), and a bind whose file was swapped away is refused, not used."""
    victim = _victim_file(tmp_path, test_user)
    path = str(tmp_path / "m.sock")
    r, w = os.pipe()
    child = _swapper(path, victim, r)
    bound = refused = 0
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                sock, _ = bind_socket(path, 0)  # the socket group: root's, unlike the victim file's
            except SocketPathError:
                refused += 1
                continue
            sock.close()
            bound += 1
            st = os.stat(victim)
            assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o600, test_user.pw_gid)
    finally:
        os.write(w, b"x")
        os.waitpid(child, 0)
    st = os.stat(victim)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o600, test_user.pw_uid, test_user.pw_gid)
    assert bound + refused > 50  # the race was really run, many times


def test_mode_and_group_are_right_whatever_the_umask(test_user: pwd.struct_passwd, tmp_path: Path) -> None:
    """0660 and the socket group even with a umask of 0."""
    old = os.umask(0)
    try:
        sock, inode = bind_socket(str(tmp_path / "m.sock"), test_user.pw_gid)
    finally:
        os.umask(old)
    sock.close()
    st = os.lstat(tmp_path / "m.sock")
    assert stat.S_ISSOCK(st.st_mode) and st.st_ino == inode
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o660, 0, test_user.pw_gid)


def test_link_planted_at_the_socket_path_is_refused(
    test_user: pwd.struct_passwd, tmp_path: Path, start_daemon: Callable[..., Daemon]
) -> None:
    victim = _victim_file(tmp_path, test_user)
    path = tmp_path / "m.sock"
    path.symlink_to(victim)
    d = start_daemon("--interval", "0.5", "--socket-group", "root", socket=str(path), wait=False)
    assert _exit_code(d) == 1
    assert f"{path} exists and is a symbolic link; not replacing it" in d.log, d.log
    st = os.stat(victim)
    assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o600, test_user.pw_gid) and path.is_symlink()


def test_live_daemon_and_stale_socket_behave_as_before(tmp_path: Path, start_daemon: Callable[..., Daemon]) -> None:
    path = str(tmp_path / "m.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()
    d = start_daemon("--interval", "0.5", socket=path)  # the stale file of ours is replaced
    with pytest.raises(DaemonAlreadyRunning):
        bind_socket(path, None)
    assert d.proc.poll() is None


# --------------------------------------------------------------------------- a squatter on the path


def test_cli_refuses_a_squatter_and_shows_no_fake_data(test_user: pwd.struct_passwd, user_dir: str) -> None:
    """The test user serves fake data on a socket root's ``memagent ls`` is pointed at:
    refused, exit 1, one line naming the path and the squatter's UID. Trusting that UID
    on purpose ($MEMAGENT_DAEMON_UID) shows the squatter did serve a working daemon."""
    path = os.path.join(user_dir, "memagent.sock")
    with _squatter(test_user, path):
        r = memagent_cli("ls", "--socket", path, env={"MEMAGENT_DAEMON_UID": ""})
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert r.stderr.splitlines() == [f"memagent: refusing the daemon at {path}: it runs as uid {test_user.pw_uid} "
                                         "(trusted: root); set MEMAGENT_DAEMON_UID to trust another owner"]
        assert "FAKE" not in r.stdout
        typo = memagent_cli("ls", "--socket", path, env={"MEMAGENT_DAEMON_UID": "no-such-user-memagent"})
        assert typo.returncode == 1 and typo.stderr.splitlines() == [
            f"memagent: refusing the daemon at {path}: it runs as uid {test_user.pw_uid} (trusted: root); "
            "MEMAGENT_DAEMON_UID='no-such-user-memagent' names no user"]
        trusted = memagent_cli("ls", "--socket", path, env={"MEMAGENT_DAEMON_UID": TEST_USER})
        assert trusted.returncode == 0 and "4242  FAKE" in trusted.stdout, (trusted.stdout, trusted.stderr)


def test_memtop_refuses_a_squatter_and_starts_no_embedded_agent(
    test_user: pwd.struct_passwd, user_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = os.path.join(user_dir, "memagent.sock")
    monkeypatch.delenv("MEMAGENT_DAEMON_UID", raising=False)
    posted: list[object] = []
    connector = Connector(path, posted.append, allow_embedded=True)

    async def run() -> None:
        task = asyncio.ensure_future(connector.run())
        for _ in range(100):
            if posted:
                break
            await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    with _squatter(test_user, path):
        asyncio.run(run())
    connector.stop()
    assert posted and isinstance(posted[0], LinkDown), posted
    assert posted[0].reason.startswith(f"refusing the daemon at {path}: it runs as uid {test_user.pw_uid}")
    assert connector.embedded is None and not any(isinstance(m, LinkUp) for m in posted)


def test_trusted_daemons_are_accepted(
    test_user: pwd.struct_passwd, user_dir: str, shared_dir: str, start_daemon: Callable[..., Daemon]
) -> None:
    """Root's client to root's daemon; a user's client to a daemon of its own UID."""
    d = start_daemon("--interval", "0.5", "--socket-group", TEST_USER, socket=os.path.join(shared_dir, "m.sock"))
    r = memagent_cli("ls", "--socket", d.socket)
    assert r.returncode == 0, r.stderr
    path = os.path.join(user_dir, "own.sock")

    def own_daemon_and_client() -> list[object]:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)

        def serve() -> None:
            conn, _ = server.accept()
            conn.sendall(FAKE)
            while conn.recv(65536):
                pass
            conn.close()

        threading.Thread(target=serve, daemon=True).start()
        with Client(path) as c:
            own = [c.server_hello.software, [p.name for p in c.list()]]
        with Client(d.socket) as c:  # and root's daemon, through the socket group
            return [*own, c.server_hello.role]

    assert as_user(test_user, own_daemon_and_client) == ["fake-daemon", ["FAKE-PROCESS"], "server"]


# --------------------------------------------------------------------------- the check itself


def test_check_server_uid() -> None:
    check_server_uid(0, 1000)
    check_server_uid(1000, 1000)
    check_server_uid(1001, 1000, (1001,))
    with pytest.raises(UntrustedDaemon) as exc:
        check_server_uid(1001, 1000, (), "/x.sock")
    assert str(exc.value) == ("refusing the daemon at /x.sock: it runs as uid 1001 (trusted: root, uid 1000); "
                              "set MEMAGENT_DAEMON_UID to trust another owner")
    assert trusted_uids({}) == () and trusted_uids({"MEMAGENT_DAEMON_UID": "123"}) == (123,)
    assert trusted_uids({"MEMAGENT_DAEMON_UID": "root"}) == (0,)
    with pytest.raises(ValueError, match="names no user"):
        trusted_uids({"MEMAGENT_DAEMON_UID": "no-such-user-memagent"})
