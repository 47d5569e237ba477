"""The hook runner (:class:`HookRunner`) on a real event loop with a real hook command
(``/bin/sh`` scripts writing what they got to a file): its rate limits, its bounded
waiting map, its timeout, the user and environment it runs the hook with; and the
config keys that set them.

Synchronisation: :meth:`HookRunner.drained` (no alert waits, no hook runs)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from memagent.alerting.hooks import LANG, HookRunner
from memagent.config import HOOK_PATH as PATH
from memagent.config import AlertConfig, validate
from memagent.errors import ConfigError
from memproto.records import Alert
from memproto.vocabulary import AlertState, Severity

ROOT = os.geteuid() == 0
NO_SUCH_USER = "memagent-no-such-user"


class HookDir:
    """A directory every user can traverse (pytest's tmp_path is root's, 0700), holding a
    ``/bin/sh`` hook script and files it may write even when it runs as ``nobody``."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="memagent-hook-", dir="/tmp"))
        self.path.chmod(0o755)
        self.out = self.file("out")

    def file(self, name: str) -> Path:
        path = self.path / name
        path.touch()
        path.chmod(0o666)
        return path

    def script(self, body: str) -> list[str]:
        path = self.path / "hook.sh"
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
        return ["/bin/sh", str(path)]

    def recorder(self) -> list[str]:
        """Each run appends: start time (Unix, ns resolution), uid, the alert's JSON."""
        return self.script(f'alert=$(cat)\nprintf \'%s\\t%s\\t%s\\n\' "$(date +%s.%N)" "$(id -u)" "$alert" '
                           f'>> {self.out}\n')

    def runs(self) -> list[tuple[float, int, dict[str, object]]]:
        out = []
        for line in self.out.read_text().splitlines():
            when, uid, alert = line.split("\t", 2)
            out.append((float(when), int(uid), json.loads(alert)))
        return sorted(out, key=lambda r: r[0])


@pytest.fixture
def hook_dir() -> Iterator[HookDir]:
    d = HookDir()
    yield d
    shutil.rmtree(d.path, ignore_errors=True)


def alert(resource: str = "host", state: str = AlertState.FIRING, value: float = 1.0, kind: str = "headroom") -> Alert:
    return Alert(id=1, kind=kind, state=state, severity=Severity.WARNING, resource=resource, value=value,
                 threshold=0.9, message=f"{kind} {resource} {state}", time=0.0, contributors=[])


def assert_ends(pid: int) -> None:
    """``pid`` has ended, or does within 5 s (a pidfd is readable once its process ended)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # already gone and reaped
    try:
        readable, _, _ = select.select([fd], [], [], 5.0)
        assert readable, f"process {pid}, started by the hook, outlived it"
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- rate limits


@pytest.mark.e2e
async def test_a_burst_for_one_key_runs_once_then_delivers_the_last_state_after_the_window(
    hook_dir: HookDir, caplog: pytest.LogCaptureFixture
) -> None:
    runner = HookRunner(hook_dir.recorder(), 5.0, min_interval=0.5, rate=100.0, burst=100)
    for i in range(49):
        runner.submit(alert(value=float(i)))
    runner.submit(alert(state=AlertState.RESOLVED, value=0.0))
    await runner.drained()
    await runner.close()
    runs = hook_dir.runs()
    assert [(r[2]["state"], r[2]["value"]) for r in runs] == [("firing", 0.0), ("resolved", 0.0)]
    assert runs[1][0] - runs[0][0] >= 0.5 - 0.05  # the second run waited for the key's window
    assert (runner.ran, runner.failed, runner.delayed, runner.coalesced, runner.dropped) == (2, 0, 49, 48, 0)
    coalescing = [r for r in caplog.records if "come faster than the hook may run (once per 0.5 s" in r.getMessage()]
    assert len(coalescing) == 1  # said once for the key, not once per alert


@pytest.mark.e2e
async def test_many_keys_at_once_are_spread_by_the_global_rate(hook_dir: HookDir) -> None:
    rate, burst, keys = 10.0, 2, 8
    runner = HookRunner(hook_dir.recorder(), 5.0, min_interval=10.0, rate=rate, burst=burst)
    for k in range(keys):
        runner.submit(alert(resource=f"gpu-{k}"))
    await runner.drained()
    await runner.close()
    runs = hook_dir.runs()
    assert sorted(str(r[2]["resource"]) for r in runs) == sorted(f"gpu-{k}" for k in range(keys))
    first = runs[0][0]
    for n, (when, _, _) in enumerate(runs):
        # ``burst`` at once, then one per 1/rate seconds (each start measured in the hook).
        assert when - first >= max(0, n - burst + 1) / rate - 0.05, (n, when - first)
    assert (runner.ran, runner.delayed, runner.coalesced, runner.dropped) == (keys, keys - burst, 0, 0)


@pytest.mark.e2e
async def test_waiting_alerts_are_bounded_by_distinct_keys_and_a_resolution_takes_a_firing_ones_place(
    hook_dir: HookDir,
) -> None:
    runner = HookRunner(hook_dir.recorder(), 5.0, min_interval=0.0, rate=20.0, burst=1, max_waiting=3)
    runner.submit(alert(resource="k0"))  # runs at once: the bucket is then empty
    for k in range(1, 11):
        runner.submit(alert(resource=f"k{k}"))  # k1..k3 wait, k4..k10 are dropped
    for _ in range(20):
        runner.submit(alert(resource="k2", value=2.0))  # a waiting key: replaced, the map does not grow
    assert runner.waiting == 3
    runner.submit(alert(resource="k11", state=AlertState.RESOLVED))  # takes k1's place
    assert runner.waiting == 3
    await runner.drained()
    await runner.close()
    got = [(r[2]["resource"], r[2]["state"], r[2]["value"]) for r in hook_dir.runs()]
    assert got == [("k0", "firing", 1.0), ("k2", "firing", 2.0), ("k3", "firing", 1.0), ("k11", "resolved", 1.0)]
    assert runner.dropped == 8 and runner.coalesced == 20


# --------------------------------------------------------------------------- one run


@pytest.mark.e2e
async def test_the_hook_gets_a_minimal_environment_in_slash_as_hook_user(
    hook_dir: HookDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMAGENT_SECRET", "x")
    seen = hook_dir.file("seen")
    argv = hook_dir.script(f"cat >/dev/null\n{{ id -u; id -G; pwd; env; }} > {seen}\n")
    runner = HookRunner(argv, 5.0, user="nobody")
    runner.submit(alert(kind="budget", resource="bert"))
    await runner.drained()
    await runner.close()
    uid, groups, cwd, *env_lines = seen.read_text().splitlines()
    env = dict(line.split("=", 1) for line in env_lines)
    assert runner.failed == 0
    assert cwd == "/"
    assert "MEMAGENT_SECRET" not in env
    assert env["PATH"] == PATH and env["LANG"] == LANG and env["MEMAGENT_ALERT_KIND"] == "budget"
    assert set(env) <= {"PATH", "LANG", "HOME", "MEMAGENT_ALERT_KIND", "PWD"}  # PWD: the shell's own
    if ROOT:
        assert int(uid) == 65534 and groups.split() == ["65534"]  # nobody, no supplementary groups
        assert env["HOME"] == "/nonexistent"
    else:
        assert int(uid) == os.geteuid()


@pytest.mark.e2e
async def test_a_hook_past_its_timeout_is_killed_with_what_it_started(hook_dir: HookDir) -> None:
    child = hook_dir.file("child")
    argv = hook_dir.script(f"cat >/dev/null\nsleep 600 &\necho $! > {child}\nwait\n")
    runner = HookRunner(argv, 0.5)
    runner.submit(alert())
    await runner.drained()
    await runner.close()
    assert runner.failed == 1
    assert_ends(int(child.read_text()))


@pytest.mark.e2e
async def test_a_missing_hook_is_counted_and_the_next_alert_still_runs(hook_dir: HookDir) -> None:
    runner = HookRunner([str(hook_dir.path / "missing")], 5.0, min_interval=0.0)
    runner.submit(alert())
    runner.submit(alert(state=AlertState.RESOLVED))
    await runner.drained()
    await runner.close()
    assert (runner.ran, runner.failed) == (2, 2)


@pytest.mark.e2e
async def test_close_drops_what_waits_and_kills_what_runs(hook_dir: HookDir) -> None:
    started = hook_dir.path / "started"
    os.mkfifo(started)
    started.chmod(0o666)
    runner = HookRunner(hook_dir.script(f"cat >/dev/null\nsleep 600 &\necho $! > {started}\nwait\n"), 600.0,
                        min_interval=0.0, rate=0.001, burst=1)
    runner.submit(alert(resource="a"))
    runner.submit(alert(resource="b"))  # waits: the bucket is empty for the next 1000 s
    assert runner.waiting == 1
    fd = os.open(started, os.O_RDONLY | os.O_NONBLOCK)
    try:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        loop.add_reader(fd, ready.set)
        await asyncio.wait_for(ready.wait(), 10)  # the hook runs and has started its child
        loop.remove_reader(fd)
        child = int(os.read(fd, 64))
    finally:
        os.close(fd)
    await runner.close()
    assert runner.waiting == 0 and runner.ran == 1
    assert_ends(child)


# --------------------------------------------------------------------------- config


def test_hook_user_must_exist() -> None:
    with pytest.raises(ConfigError) as exc:
        validate({"alerts": {"hook_user": NO_SUCH_USER}})
    assert str(exc.value).startswith(f"alerts.hook_user: no such user: '{NO_SUCH_USER}'")
    assert validate({"alerts": {"hook_user": "nobody"}})["alerts.hook_user"] == "nobody"


@pytest.mark.skipif(not ROOT, reason="the hook user is looked up only when the daemon is root")
def test_a_missing_hook_user_stops_the_runner_at_start() -> None:
    with pytest.raises(ConfigError, match=re.escape("alerts.hook_user: no such user")):
        HookRunner(["/bin/true"], 5.0, user=NO_SUCH_USER)


@pytest.mark.parametrize(("key", "value"), [
    ("hook_min_interval", -1), ("hook_rate", 0), ("hook_burst", 0), ("hook_burst", 1.5), ("hook_burst", True),
    ("hook_user", 65534),
])
def test_hook_limits_are_checked(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"alerts.{key}")):
        validate({"alerts": {key: value}})


def test_hook_limit_defaults() -> None:
    c = AlertConfig()
    assert (c.hook_user, c.hook_min_interval, c.hook_rate, c.hook_burst) == ("nobody", 10.0, 1.0, 5)
    assert validate({"alerts": {"hook_min_interval": 0}})["alerts.hook_min_interval"] == 0.0
