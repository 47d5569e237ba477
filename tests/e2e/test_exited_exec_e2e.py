"""End to end, as the second user against a real root daemon (docs/security.md section 14):

* the exited slots are shared by UID: a user's churn of short-lived processes (attached
  here by root, as an operator's pattern attaches them) evicts only its own exited entries, and
  root's killed model keeps its exited entry with its peak;
* a watched process that runs a new program (exec) is shown with the new program's name
  and command line, announced again with an ``attached`` event.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Daemon, Target, memagent_cli, poll

from memproto.frames import Attached

#: More than the 256 exited slots: on the old code root's entry, the oldest, went first.
CHURN = 320
BATCH = 80


def test_a_users_churn_leaves_roots_exited_entry_and_peak(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], test_user: pwd.struct_passwd
) -> None:
    """The second user's processes (run as that user, attached as an operator's pattern
    would attach them, killed batch after batch) fill the exited slots past their bound."""
    d = start_daemon("--interval", "0.1", "--no-gpu", "--no-stacks", "--no-record")
    model = make_target()  # root's model
    model.do("alloc 96")
    with d.client() as c:
        c.attach([model.pid], label="root-model")
        poll("the model's peak read", lambda: any(p.pid == model.pid and p.rss_peak_bytes >= 96 << 20
                                                   for p in c.list()))
        model.kill()
        poll("the model exited", lambda: any(p.pid == model.pid and not p.alive for p in c.list()))
        for _ in range(CHURN // BATCH):
            procs = [subprocess.Popen(["/bin/sleep", "60"], user=test_user.pw_uid, group=test_user.pw_gid,
                                      extra_groups=[], stdin=subprocess.DEVNULL)
                     for _ in range(BATCH)]
            c.attach([p.pid for p in procs])
            for p in procs:
                p.kill()
                p.wait(10)
            pids = {p.pid for p in procs}
            poll("the batch exited", lambda pids=pids: not any(p.alive for p in c.list() if p.pid in pids))
        listed = c.list()
    exited = [p for p in listed if not p.alive]
    assert len(exited) == 256  # the bound holds: the user's oldest went
    assert sum(1 for p in exited if p.uid == test_user.pw_uid) == 255
    (mine,) = [p for p in listed if p.pid == model.pid]
    assert mine.label == "root-model" and not mine.alive and mine.rss_peak_bytes >= 96 << 20
    assert d.proc.poll() is None


@pytest.mark.parametrize("events", ["netlink", "polling"])
def test_a_watched_process_that_execs_shows_the_new_program(
    start_daemon: Callable[..., Daemon], test_user: pwd.struct_passwd, events: str
) -> None:
    """With the kernel's exec event (netlink), and without (``--no-netlink``: the sampler
    sees the status ``Name:`` line change)."""
    extra = ("--no-netlink",) if events == "polling" else ()
    d = start_daemon("--interval", "0.1", "--no-gpu", "--no-stacks", "--no-record", *extra)
    r, w = os.pipe()
    user = test_user

    def child() -> None:
        os.close(w)
        os.dup2(r, 0)
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
        os.execv("/bin/sh", ["/bin/sh", "-c", "read go; exec /bin/sleep 30", "h25-exec-marker"])

    pid = os.fork()
    if pid == 0:
        try:
            child()
        finally:
            os._exit(127)
    os.close(r)
    try:
        poll("the shell runs", lambda: b"h25-exec-marker" in Path(f"/proc/{pid}/cmdline").read_bytes())
        with d.client() as c:
            (info,) = c.attach([pid], label="kept").attached
            assert info.name == "sh" and "h25-exec-marker" in info.cmdline
            c.subscribe()
            os.write(w, b"go\n")  # the shell execs sleep
            deadline = time.monotonic() + 15
            again = None
            for frame in c.stream():
                if isinstance(frame, Attached) and frame.process.pid == pid and frame.process.name == "sleep":
                    again = frame.process
                    break
                assert time.monotonic() < deadline, "no attached event with the new name:\n" + d.log
            assert again is not None
            assert again.cmdline == ["/bin/sleep", "30"] and again.label == "kept"
            assert again.start_time == info.start_time  # the same process, announced again
        ls = memagent_cli("ls", "--json", "--socket", d.socket)
        assert ls.returncode == 0, ls.stderr
        assert '"name": "sleep"' in ls.stdout and "h25-exec-marker" not in ls.stdout
    finally:
        os.close(w)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
