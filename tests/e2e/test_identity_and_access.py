"""Identity (a reused PID is a new process), authorisation (SO_PEERCRED), auto-attach."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import TEST_USER, Daemon, MiB, Target, as_user, spawn_with_pid, wait_sample

from memagent.client import Client
from memproto.frames import Attached, Exited, Sample


@pytest.mark.skipif(os.geteuid() != 0, reason="steering PIDs through ns_last_pid needs root")
def test_reused_pid_is_never_mistaken_for_the_old_process(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target]
) -> None:
    d = start_daemon("--interval", "1")
    old = make_target()
    old.do("alloc 100")
    with d.client() as c:
        (info,) = c.attach([old.pid]).attached
        c.subscribe()
        pid = old.pid
        # Kill, reap and reuse the PID between two ticks.
        old.kill()
        new = spawn_with_pid(pid, [sys.executable, "-c", "import sys; sys.stdin.read()"])
        if new is None:
            pytest.skip("could not get the same PID back (busy system)")
        try:
            exited = next(f for f in c.stream() if isinstance(f, Exited))
            assert (exited.pid, exited.start_time) == (pid, info.start_time)
            (entry,) = c.list()
            assert not entry.alive and entry.start_time == info.start_time
            assert entry.rss_bytes >= 100 * MiB  # the old process's last value, not the new one's
            # Attaching the PID now watches the new process, beside the old entry.
            (fresh,) = c.attach([pid]).attached
            assert fresh.start_time > info.start_time and fresh.alive
            assert sorted(p.alive for p in c.list() if p.pid == pid) == [False, True]
        finally:
            new.kill()
            new.wait()


# --------------------------------------------------------------------------- access


def test_unprivileged_client_sees_and_touches_only_its_own_processes(
    test_user: pwd.struct_passwd,
    shared_dir: str,
    start_daemon: Callable[..., Daemon],
    make_target: Callable[..., Target],
) -> None:
    d = start_daemon("--interval", "0.1", "--socket-group", TEST_USER, socket=f"{shared_dir}/m.sock")
    root_target = make_target()
    theirs = subprocess.Popen(["sleep", "600"], user=test_user.pw_uid, group=test_user.pw_gid)
    try:
        with d.client() as c:
            c.attach([root_target.pid], label="root-model")

        def unprivileged() -> dict[str, object]:
            with Client(d.socket) as uc:
                denied = uc.attach([root_target.pid])
                own = uc.attach([theirs.pid])
                listed = [p.pid for p in uc.list()]
                detach_root = uc.detach([root_target.pid])
                reset_root = uc.reset_peaks([root_target.pid])
                uc.subscribe()
                rows = next(f for f in uc.stream() if isinstance(f, Sample)).records()
                status = uc.status()
                return {
                    "denied": [(f.pid, f.code, f.message) for f in denied.failed],
                    "own": [p.pid for p in own.attached],
                    "listed": listed,
                    "detach_root": [f.code for f in detach_root.failed],
                    "reset_root": [f.code for f in reset_root.failed],
                    "rows": [r.pid for r in rows],
                    "watched": status.watched,
                    "watched_total": status.watched_total,
                }

        out = as_user(test_user, unprivileged)
        assert out["denied"] == [[root_target.pid, "permission_denied", f"permission denied: {root_target.pid}"]]
        assert out["own"] == [theirs.pid]
        assert out["listed"] == [theirs.pid]
        # What a client may not see is, for it, not watched: no existence leak.
        assert out["detach_root"] == ["no_such_process"] and out["reset_root"] == ["no_such_process"]
        assert out["rows"] == [theirs.pid] and out["watched"] == 1
        # How many it does not see, and no more (issue 28: box-wide Σ peaks beside its own
        # rows, with nothing saying the rest was other users'): a count, never a PID.
        assert out["watched_total"] == 2
        with d.client() as c:  # root still sees both, and root's process is still watched
            assert sorted(p.pid for p in c.list()) == sorted([root_target.pid, theirs.pid])
    finally:
        theirs.kill()
        theirs.wait()


def test_socket_is_closed_to_users_outside_its_group(
    test_user: pwd.struct_passwd, shared_dir: str, start_daemon: Callable[..., Daemon]
) -> None:
    d = start_daemon("--interval", "0.5", socket=f"{shared_dir}/m.sock")
    assert os.stat(d.socket).st_mode & 0o777 == 0o660

    def try_connect() -> str:
        try:
            Client(d.socket).close()
            return "connected"
        except PermissionError:
            return "denied"

    assert as_user(test_user, try_connect) == "denied"


def test_admin_group_sees_everything(
    test_user: pwd.struct_passwd,
    shared_dir: str,
    start_daemon: Callable[..., Daemon],
    make_target: Callable[..., Target],
) -> None:
    d = start_daemon("--interval", "0.5", "--socket-group", TEST_USER, "--admin-group", TEST_USER,
                     socket=f"{shared_dir}/m.sock")
    root_target = make_target()

    def admin() -> list[int]:
        with Client(d.socket) as uc:
            return [p.pid for p in uc.attach([root_target.pid]).attached]

    assert as_user(test_user, admin) == [root_target.pid]


# --------------------------------------------------------------------------- auto-attach


def test_auto_attach_existing_and_new_processes_by_name(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    name = f"m{os.getpid() % 100000}-model"  # unique per test run; comm keeps 15 characters
    exe = tmp_path / name
    shutil.copy("/bin/sleep", exe)
    procs = [subprocess.Popen([str(exe), "600"])]
    other = subprocess.Popen(["sleep", "600"])
    try:
        d = start_daemon("--interval", "0.1", "--auto", name[:-2] + "*", "--auto-label", "auto")
        with d.client() as c:
            c.subscribe()
            assert [p.pid for p in c.list()] == [procs[0].pid]
            procs.append(subprocess.Popen([str(exe), "600"]))
            attached = next(f for f in c.stream() if isinstance(f, Attached))
            assert attached.process.pid == procs[1].pid and attached.process.label == "auto"
            assert other.pid not in {p.pid for p in c.list()}
    finally:
        for p in [*procs, other]:
            p.kill()
            p.wait()


def test_children_are_followed(daemon: Daemon, make_target: Callable[..., Target]) -> None:
    parent = make_target()
    (first,) = parent.do("fork")
    with daemon.client() as c:
        reply = c.attach([parent.pid], label="trainer", children=True)
        assert [p.pid for p in reply.attached] == [parent.pid, int(first)]
        c.subscribe()
        (second,) = parent.do("fork")
        attached = next(f for f in c.stream() if isinstance(f, Attached))
        assert attached.process.pid == int(second) and attached.process.label == "trainer"
        wait_sample(c, int(second), lambda r: r["alive"] is True)
