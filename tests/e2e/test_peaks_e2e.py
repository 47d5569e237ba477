"""reset-peaks end to end: by default it changes nothing in the target (its own
``getrusage().ru_maxrss`` stays), and the new window's peak is sampled, then exact once the
kernel's mark passes its value at the reset; ``--kernel`` resets the kernel's mark (and the
target's ru_maxrss), only for the client's own processes."""

from __future__ import annotations

import pwd
import subprocess
import time
from collections.abc import Callable

from conftest import TEST_USER, Daemon, MiB, Target, as_user, memagent_cli

from memagent.client import Client
from memproto.records import ProcessInfo


def maxrss(t: Target) -> int:
    """What the target reports about its own peak (ru_maxrss), in bytes."""
    return int(t.do("maxrss")[0])


def listed(c: Client, pid: int, until: Callable[[ProcessInfo], bool], timeout: float = 10.0) -> ProcessInfo:
    deadline = time.monotonic() + timeout
    while True:
        info = {p.pid: p for p in c.list()}[pid]
        if until(info):
            return info
        assert time.monotonic() < deadline, info
        time.sleep(0.05)


def test_reset_peaks_leaves_the_targets_own_peak_alone(daemon: Daemon, make_target: Callable[..., Target]) -> None:
    t = make_target()
    with daemon.client() as c:
        c.attach([t.pid])
        t.do("spike 120")
        before = maxrss(t)
        assert before >= 120 * MiB
        listed(c, t.pid, lambda p: p.rss_peak_bytes >= 120 * MiB)
        r = memagent_cli("reset-peaks", "--socket", daemon.socket, str(t.pid))
        assert r.returncode == 0, r.stderr
        assert "sampled until it passes the kernel's mark" in r.stdout
        assert maxrss(t) == before  # the monitor changed nothing the target reports
        info = listed(c, t.pid, lambda p: True)
        assert info.rss_peak_bytes < 100 * MiB and not info.rss_peak_exact
        # A spike smaller than the one before the reset leaves the kernel's mark where it
        # was: still sampled (a spike between two ticks is then missed).
        hwm = t.status_kb("VmHWM")
        t.do("spike 60")
        time.sleep(0.3)
        assert t.status_kb("VmHWM") == hwm
        assert not listed(c, t.pid, lambda p: True).rss_peak_exact
        # A spike above the kernel's mark at the reset: the mark is the window's peak, exact.
        t.do("spike 200")
        hwm = t.status_kb("VmHWM") * 1024
        assert hwm >= 200 * MiB
        # (A status read in the middle of the spike is exact already, its value yet lower.)
        listed(c, t.pid, lambda p: p.rss_peak_exact and p.rss_peak_bytes == hwm)
        # --kernel: the kernel's mark restarts, and with it what the target reports.
        r = memagent_cli("reset-peaks", "--kernel", "--socket", daemon.socket, str(t.pid), "--json")
        assert r.returncode == 0, r.stderr
        # The kernel's mark restarts at the current RSS. (What getrusage reports can stay
        # higher: it is also the max with signal->maxrss, which the kernel raises whenever
        # any thread of the process exits; CI saw the first spike's 144 MiB there twice.)
        assert t.status_kb("VmHWM") * 1024 < 100 * MiB
        info = listed(c, t.pid, lambda p: True)
        assert info.rss_peak_exact and info.rss_peak_bytes < 100 * MiB


def test_a_kernel_reset_is_refused_for_a_process_not_the_clients_own(
    test_user: pwd.struct_passwd, shared_dir: str, start_daemon: Callable[..., Daemon],
    make_target: Callable[..., Target],
) -> None:
    """Root included: root's client may not --kernel another user's process; that user may
    its own, and the refusal leaves the process untouched. (PID 1 is refused before
    anything is read or written: tests/serve/test_dispatch.py, on a fixture tree.)"""
    d = start_daemon("--interval", "0.1", "--socket-group", TEST_USER, socket=f"{shared_dir}/m.sock")
    root_target = make_target()
    theirs = subprocess.Popen(["sleep", "600"], user=test_user.pw_uid, group=test_user.pw_gid)
    try:
        with d.client() as c:
            c.attach([root_target.pid, theirs.pid])
            refused = c.reset_peaks([theirs.pid], kernel=True)
            assert refused.reset == [] and [(f.pid, f.code) for f in refused.failed] == [
                (theirs.pid, "permission_denied")]
            assert "only for a process of yours" in refused.failed[0].message
            r = memagent_cli("reset-peaks", "--kernel", "--socket", d.socket, str(theirs.pid))
            assert r.returncode == 1 and "only for a process of yours" in r.stderr, r
            own = c.reset_peaks([root_target.pid], kernel=True)
            assert [p.pid for p in own.reset] == [root_target.pid] and own.failed == []

        def unprivileged() -> dict[str, object]:
            with Client(d.socket) as uc:
                root_one = uc.reset_peaks([root_target.pid], kernel=True)
                own = uc.reset_peaks([theirs.pid], kernel=True)
                return {"root": [f.code for f in root_one.failed],
                        "own": [(p.pid, p.rss_peak_exact) for p in own.reset], "own_failed": own.failed}

        out = as_user(test_user, unprivileged)
        assert out == {"root": ["no_such_process"], "own": [[theirs.pid, True]], "own_failed": []}
    finally:
        theirs.kill()
        theirs.wait()
