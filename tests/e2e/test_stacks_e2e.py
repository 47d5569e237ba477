"""Python stacks from outside: the real daemon, real py-spy, real targets."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import HERE, Daemon, MiB, Target, memagent_cli, wait_sample

from memagent.config import StackConfig
from memagent.core.registry import Registry
from memagent.core.stack_collector import SAMPLING_FACTOR, StackCollector
from memproto.frames import Sample, StackStateChanged

pytestmark = pytest.mark.skipif(
    shutil.which("py-spy") is None and not Path(sys.executable).with_name("py-spy").exists(),
    reason="py-spy is not installed",
)
PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))


class StackTarget(Target):
    def __init__(self) -> None:  # the same pipe protocol, another script
        self.proc = subprocess.Popen([sys.executable, str(HERE / "stack_target.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self.pid = self.proc.pid
        self.expect("ready")


@pytest.fixture
def stack_targets() -> Iterator[Callable[[], StackTarget]]:
    made: list[StackTarget] = []

    def make() -> StackTarget:
        made.append(StackTarget())
        return made[-1]

    yield make
    for t in made:
        t.kill()


def test_the_allocating_function_is_in_the_stack_at_peak_and_tops_the_attribution(
    daemon: Daemon, stack_targets: Callable[[], StackTarget]
) -> None:
    t = stack_targets()
    with daemon.client() as c:
        c.attach([t.pid])
        c.subscribe()
        wait_sample(c, t.pid, lambda r: True)
        t.do("grow 200")
        wait_sample(c, t.pid, lambda r: r["rss_bytes"] >= 200 * MiB)
        reply = c.stack(t.pid)  # fresh: waits for a dump after the growth
    assert reply.state == "ok" and reply.at_peak is not None and reply.latest is not None
    assert reply.stack_at_peak_state == "ok"
    # The stack at peak was read while the memory rose, inside the function, near the top.
    assert reply.at_peak.rss_bytes >= 100 * MiB and (reply.at_peak.rss_rise or 0) > 0
    attributed = next(th for th in reply.at_peak.threads if th.thread_id == reply.at_peak.attributed_thread)
    assert "hold_memory" in [f.name for f in attributed.frames]
    top = reply.by_line[0]
    assert top.function == "hold_memory" and top.filename.endswith("stack_target.py")
    # Only growth seen while a stack was read is credited: part of the 200 MiB, nearly all
    # of it to the function.
    credited = sum(s.bytes for s in reply.by_function)
    assert reply.by_function[0].function == "hold_memory" and reply.by_function[0].bytes >= 0.8 * credited
    assert credited >= 20 * MiB
    # The command line shows the same, as JSON for scripts.
    r = memagent_cli("stack", "--socket", daemon.socket, str(t.pid), "--cached", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["by_line"][0]["function"] == "hold_memory"
    assert {"latest", "at_peak", "by_line", "by_function", "state"} <= out.keys()
    assert out["stack_at_peak_state"] == "ok" and out["at_peak"]["rss_rise"] > 0
    text = memagent_cli("stack", "--socket", daemon.socket, str(t.pid), "--cached").stdout
    assert "stack at peak" in text and "rising" in text


def test_a_c_only_process_is_not_a_python_process(daemon: Daemon) -> None:
    proc = subprocess.Popen(["sleep", "600"])
    try:
        with daemon.client() as c:
            c.attach([proc.pid])
            reply = c.stack(proc.pid)
            assert reply.state == "not_python" and "not a Python process" in (reply.message or "")
            assert {p.pid: p for p in c.list()}[proc.pid].stack_state == "not_python"
        r = memagent_cli("stack", "--socket", daemon.socket, str(proc.pid))
        assert r.returncode == 1 and "not_python" in r.stdout
    finally:
        proc.kill()
        proc.wait()


def _stand_in(tmp: Path, body: str) -> Path:
    """A directory holding a ``py-spy`` stand-in script, to put first on PATH."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "py-spy"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return bin_dir


def test_a_hanging_py_spy_is_killed_while_samples_flow(
    start_daemon: Callable[..., Daemon], stack_targets: Callable[[], StackTarget], tmp_path: Path
) -> None:
    pidfile = tmp_path / "hung.pid"
    bin_dir = _stand_in(tmp_path, f"echo $$ > {pidfile}\nexec sleep 600\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    d = start_daemon("--interval", "0.05", "--stack-timeout", "1", env=env)
    t = stack_targets()
    with d.client() as c:
        c.attach([t.pid])
        c.subscribe()
        c.stack(t.pid, fresh=False)  # nothing yet; now ask for a fresh one without waiting for it
        c.send(__import__("memproto").frames.Stack(99, t.pid, True))
        seqs: list[int] = []
        state = None
        for frame in c.stream():
            if isinstance(frame, Sample):
                seqs.append(frame.seq)
            if isinstance(frame, StackStateChanged) and frame.pid == t.pid and frame.state == "timeout":
                state = frame.state
                break
            assert len(seqs) < 400, "py-spy was never killed"
        assert state == "timeout"
        # The memory tick went on while py-spy hung: consecutive samples, about 20 a second.
        assert len(seqs) >= 10 and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    hung = int(pidfile.read_text())
    assert not Path(f"/proc/{hung}").exists() or "Z" in Path(f"/proc/{hung}/stat").read_text().split()[2]


def test_a_target_that_exits_during_the_dump(
    start_daemon: Callable[..., Daemon], stack_targets: Callable[[], StackTarget], tmp_path: Path
) -> None:
    # The real py-spy, run just after its target was killed: the dump fails as "exited".
    # (The test, its parent, reaps it later: until then it is a zombie, which py-spy can't read.)
    bin_dir = _stand_in(tmp_path, 'kill -9 "$3"\n'
                                  'while [ -e /proc/$3 ] && ! grep -q ") Z" /proc/$3/stat; do :; done\n'
                                  f'exec {PY_SPY} "$@"\n')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    d = start_daemon("--interval", "0.1", env=env)
    t = stack_targets()
    with d.client() as c:
        c.attach([t.pid])
        reply = c.stack(t.pid)
        assert reply.state == "exited", reply
        c.subscribe()
        wait_sample(c, t.pid, lambda r: r["alive"] is False)
        assert c.status().pid == d.proc.pid  # and the daemon serves on


def test_py_spy_missing_is_said(start_daemon: Callable[..., Daemon], stack_targets: Callable[[], StackTarget]) -> None:
    d = start_daemon("--interval", "0.1", "--py-spy", "/nonexistent/py-spy")
    t = stack_targets()
    with d.client() as c:
        c.attach([t.pid])
        reply = c.stack(t.pid)
        assert reply.state == "py_spy_missing" and "pip install py-spy" in (reply.message or "")
        assert c.status().stack_note == "py-spy not found"


def test_the_dump_budget_holds_with_50_processes_growing_at_once(
    start_daemon: Callable[..., Daemon], stack_targets: Callable[[], StackTarget]
) -> None:
    budget, burst = 2.0, 4
    d = start_daemon("--interval", "0.1", "--stack-budget", str(budget))
    targets = [stack_targets() for _ in range(50)]
    with d.client() as c:
        c.attach([t.pid for t in targets])
        c.subscribe()
        start = c.status()
        for t in targets:  # all grow by more than the 32 MiB threshold
            t.do("grow 40")
        frames = 0
        for frame in c.stream():
            frames += isinstance(frame, Sample)
            if frames == 40:  # 4 s of ticks
                break
        end = c.status()
    elapsed = end.tick.ticks - start.tick.ticks
    dumps = end.stack_dumps - start.stack_dumps
    assert dumps >= 4, "growth did not trigger dumps"
    # The budget's dumps, and the sampling dumps while memory grows, from a bucket of their
    # own (SAMPLING_FACTOR x the budget a second, 2 saved up).
    assert dumps <= (1 + SAMPLING_FACTOR) * budget * elapsed * 0.1 + burst + 2 + 1, (dumps, elapsed)
    assert end.tick.overruns - start.tick.overruns <= 3


def test_unprivileged_reader_gets_permission_denied(stack_targets: Callable[[], StackTarget], tmp_path: Path) -> None:
    """An agent without the rights to read root's process says so, with the fix."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the reader as another user")
    try:
        user = pwd.getpwnam("memagent-test")
    except KeyError:
        if shutil.which("useradd") is None:
            pytest.skip("no second user and no useradd")
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        "memagent-test"], check=True, capture_output=True)
        user = pwd.getpwnam("memagent-test")
    t = stack_targets()
    # py-spy lives in the venv under root's home (0700): copy it where the user can run it.
    shared = Path(__import__("tempfile").mkdtemp(prefix="memagent-pyspy-", dir="/tmp"))
    try:
        shared.chmod(0o755)
        shutil.copy(PY_SPY, shared / "py-spy")
        (shared / "py-spy").chmod(0o755)
        r, w = os.pipe()
        child = os.fork()
        if child == 0:  # the reader, as the unprivileged user, with the agent's own code
            os.close(r)
            out = {"error": "did not run"}
            try:
                os.setgroups([])
                os.setgid(user.pw_gid)
                os.setuid(user.pw_uid)
                out = _collect_as_user(t.pid, str(shared / "py-spy"))
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                out = {"error": repr(exc)}
            os.write(w, json.dumps(out).encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            out = json.loads(f.read())
        os.waitpid(child, 0)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    assert out.get("state") == "permission_denied", out
    assert "CAP_SYS_PTRACE" in out["message"]


def _collect_as_user(pid: int, py_spy: str) -> dict[str, str | None]:
    """Runs after dropping to a user who cannot read the interpreter's standard library
    (under root's home, mode 0700): everything it imports is imported at the top."""

    async def main() -> dict[str, str | None]:
        registry = Registry()
        (w,) = registry.attach(pid)
        collector = StackCollector(StackConfig(py_spy=py_spy))
        runner = asyncio.ensure_future(collector.run())
        await collector.demand(w)
        runner.cancel()
        ps = collector.stacks[w.key]
        return {"state": ps.state, "message": ps.message}

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    return asyncio.run(main())
