"""Fixtures for end-to-end tests: a real daemon on a temporary socket, real target processes.
For unit tests: a writable copy of the fixture /proc tree and a registry over it
(``proctree.py``); the fake NVML library (``fakes/``).

Synchronisation is by events: the daemon's "listening on" log line, a target's "ok" reply
on its stdout, a sample frame carrying the awaited value. Never by sleeping.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import tiers
from fakes.fakenvml import build_fake_nvml
from proctree import ProcTree

from memagent.client import Client
from memagent.core.registry import Registry
from memproto.frames import Sample

HERE = Path(__file__).resolve().parent
MiB = 1024 * 1024


# --------------------------------------------------------------------------- the two tiers (tiers.py)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", tiers.MARKER)
    tiers.install()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers.mark(items)


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_process(request: pytest.FixtureRequest) -> Iterator[None]:
    """Outside ``e2e``, any process start fails the test (tiers.py says why)."""
    if request.node.get_closest_marker("e2e") is not None:
        yield
        return
    tiers.GUARD.test, tiers.GUARD.refused = request.node.nodeid, []
    try:
        yield
    finally:
        refused, tiers.GUARD.test = tiers.GUARD.refused, None
    if refused:
        pytest.fail(f"started a process outside the e2e tier: {refused[0]} (tests/tiers.py)", pytrace=False)


class Daemon:
    """A real ``memagent daemon`` subprocess."""

    def __init__(self, socket: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.socket = socket
        self.lines: list[str] = []
        self._listening = threading.Event()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memagent.cli", "daemon", "--socket", socket, *args],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            if "listening on" in line:
                self._listening.set()
        self._listening.set()  # EOF: wake waiters; they check returncode

    def wait_listening(self, timeout: float = 15.0) -> None:
        if not self._listening.wait(timeout) or self.proc.poll() is not None:
            raise RuntimeError("daemon did not start:\n" + "\n".join(self.lines))

    def client(self, timeout: float = 10.0) -> Client:
        return Client(self.socket, timeout=timeout)

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        self._reader.join(timeout)
        return rc

    @property
    def log(self) -> str:
        return "\n".join(self.lines)


class Target:
    """A real Python process driven over pipes (see ``target_proc.py``)."""

    def __init__(self, python: str = sys.executable, **popen: object) -> None:
        self.proc = subprocess.Popen(
            [python, str(HERE / "target_proc.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            **popen,  # type: ignore[call-overload]
        )
        self.pid = self.proc.pid
        self.expect("ready")

    def expect(self, word: str) -> list[str]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        parts = line.split()
        if parts[:2] != ["ok", word]:
            raise AssertionError(f"target {self.pid}: expected 'ok {word}', got {line!r}")
        return parts[2:]

    def do(self, command: str) -> list[str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.expect(command.split()[0])

    def status_kb(self, key: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise KeyError(key)

    def exit(self) -> None:
        self.do("exit")
        self.proc.wait(10)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def sock_path(tmp_path: Path) -> str:
    return str(tmp_path / "memagent.sock")


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def start(*args: str, socket: str | None = None, wait: bool = True, env: dict[str, str] | None = None) -> Daemon:
        d = Daemon(socket or str(tmp_path / f"d{len(started)}.sock"), *args, env=env)
        started.append(d)
        if wait:
            d.wait_listening()
        return d

    yield start
    for d in started:
        d.stop()


@pytest.fixture
def daemon(start_daemon: Callable[..., Daemon]) -> Daemon:
    """A daemon ticking every 0.1 s."""
    return start_daemon("--interval", "0.1")


@pytest.fixture
def make_target() -> Iterator[Callable[..., Target]]:
    targets: list[Target] = []

    def make(**kw: object) -> Target:
        t = Target(**kw)  # type: ignore[arg-type]
        targets.append(t)
        return t

    yield make
    for t in targets:
        t.kill()


def poll(what: str, check: Callable[[], Any], timeout: float = 15.0) -> Any:
    """``check()``'s first truthy value, asked every 50 ms; AssertionError naming ``what``
    and the last value after ``timeout`` s (for a state with no event to await)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s (last: {value!r})")
        time.sleep(0.05)


def wait_sample(client: Client, pid: int, predicate: Callable[[dict[str, object]], bool],
                max_frames: int = 200) -> dict[str, object]:
    """Read frames from a subscribed client until the row of ``pid`` satisfies ``predicate``."""
    for n, frame in enumerate(client.stream()):
        if isinstance(frame, Sample):
            for rec in frame.records():
                if rec.pid == pid:
                    row = dataclasses.asdict(rec)
                    if predicate(row):
                        return row
        if n >= max_frames:
            break
    raise AssertionError(f"no sample of {pid} satisfied the predicate within {max_frames} frames")


def memagent_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memagent.cli", *args], capture_output=True, text=True, timeout=30,
        env={**os.environ, **(env or {})},
    )


# --------------------------------------------------------------------------- fake NVML (tests/proc/test_fake_nvml*.py)

#: What ``build_lib`` returns: ``build(omit=(), defines=())`` -> the fake library's directory.
BuildFn = Callable[..., Path]


@pytest.fixture(scope="session")
def build_lib(tmp_path_factory: pytest.TempPathFactory) -> BuildFn:
    """Build (once per session per variant) a fake NVML; returns its directory."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not on PATH: cannot build the fake NVML library")
    cache: dict[tuple[tuple[str, ...], tuple[str, ...]], Path] = {}

    def build(omit: Sequence[str] = (), defines: Sequence[str] = ()) -> Path:
        key = (tuple(sorted(omit)), tuple(sorted(defines)))
        if key not in cache:
            out = tmp_path_factory.mktemp("fake-nvml")
            cache[key] = build_fake_nvml(out, omit, defines=dict.fromkeys(defines))
        return cache[key]

    return build


@pytest.fixture(scope="session")
def lib_dir(build_lib: BuildFn) -> Path:
    return build_lib()


# --------------------------------------------------------------------------- unit tests over a fixture /proc tree


@pytest.fixture
def proc_tree(tmp_path: Path) -> ProcTree:
    """A writable copy of ``fixtures/proc`` (see ``proctree.py``)."""
    return ProcTree(tmp_path / "proc")


@pytest.fixture
def registry(proc_tree: ProcTree) -> Iterator[Registry]:
    """A registry over ``proc_tree``; its handles are closed afterwards."""
    reg = Registry(proc_tree.procfs())
    yield reg
    reg.close()


# --------------------------------------------------------------------------- a small real disk


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=``: "1m", "4m") at ``where``, mode 0700: a real
    disk small enough to fill. Root only: the test is skipped where it cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir(mode=0o700, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill_disk(path: Path) -> Path:
    """A new file at ``path`` taking every byte its disk has left (written until ENOSPC);
    removing it gives the space back."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * 65536):
                pass
    finally:
        os.close(fd)
    return path


# --------------------------------------------------------------------------- a second user

#: An unprivileged user for the access and security tests (created when missing).
TEST_USER = "memagent-test"


@pytest.fixture(scope="session")
def test_user() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("creating a second user needs root")
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        pass
    if shutil.which("useradd") is None:
        pytest.skip("no useradd to create a test user")
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER],
                   check=True, capture_output=True)
    return pwd.getpwnam(TEST_USER)


@pytest.fixture
def shared_dir() -> Iterator[str]:
    """A socket directory another user can traverse (pytest's tmp_path is 0700)."""
    path = tempfile.mkdtemp(prefix="memagent-acl-", dir="/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_user(user: pwd.struct_passwd, fn: Callable[[], object]) -> object:
    """Run ``fn`` in a forked child with the user's credentials; return its JSON result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop privileges, connect as that user
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the test
            result, code = {"error": f"{type(exc).__name__}: {exc}"}, 1
        os.write(w, json.dumps(result).encode())
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    out = json.loads(data)
    assert os.waitstatus_to_exitcode(status) == 0, out
    return out


def spawn_with_pid(pid: int, argv: list[str]) -> subprocess.Popen[bytes] | None:
    """Start ``argv`` as PID ``pid`` by steering the kernel's next PID (root only)."""
    for _ in range(50):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


def remove_cgroups(root: Path, dirs: Sequence[Path]) -> None:
    """Remove cgroups a test made under the hierarchy ``root``, deepest first: processes
    still in them are moved back to the root first, and a directory a process is still
    leaving is tried again for up to 5 s."""
    for path in dirs:
        with contextlib.suppress(OSError):
            pids = (path / "cgroup.procs").read_text().split()
            for pid in pids:
                with contextlib.suppress(OSError):
                    (root / "cgroup.procs").write_text(pid)
    for path in sorted(set(dirs), key=lambda p: -len(p.parts)):
        for _ in range(50):
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # a process is still leaving it
                time.sleep(0.1)


# --------------------------------------------------------------------------- metrics (docs/metrics.md)


def free_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on now (the kernel's pick: another process
    may take it before the test binds it, which the test then reports)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int, accept: str | None = None, path: str = "/metrics",
           method: str = "GET") -> tuple[int, str, str]:
    """(status, content type, body) of one request to the daemon's metrics endpoint."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, headers={"Accept": accept} if accept else {})
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type", ""), r.read().decode()
    finally:
        conn.close()
