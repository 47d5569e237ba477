"""The corner cases of the kernel's process events (issue 11), against the real kernel:
real processes, real netlink sockets, the agent's own registry, sampler and
:class:`ProcessEvents` (or the real daemon), and what /proc shows meanwhile.

1. A process whose main thread exits first (``pthread_exit``) lives on in its other
   threads; its main thread's exit record is not its final peak.
2. A watched process's PID reused before the next tick: the new process is never taken
   for the old, nor their exit records swapped.
3. A followed parent's child reaped before its fork event is handled: no unrelated process
   is attached in its place, and its exit record still makes it an exited entry.
4. Socket overruns: counted, the /proc scan runs at once, and an exit record that may
   have been lost never lets another process's record make a peak exact.

The targets are one small C program (below), built with the box's C compiler; the tests
drive it over pipes and wait for its ``ok`` lines. The agent reads the sockets when the
test calls :meth:`ProcessEvents.drain`: everything the kernel sent before is queued by
then (a fork event at the fork, an exit record before the process can be reaped).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Daemon, memagent_cli, spawn_with_pid, wait_sample

from memagent.client import Client
from memagent.core.autoattach import Scanner
from memagent.core.process_events import ProcessEvents
from memagent.core.registry import Registry
from memagent.core.sampler import Sampler
from memagent.core.watched import Watched
from memagent.proc.procfs import ProcFS
from memproto.frames import Exited

MiB = 1 << 20
#: How far a peak may be from the target's own last VmHWM read: the kernel's exit record
#: sums the per-CPU RSS counters approximately, and the target touches a few pages after
#: its read (to print it).
TOLERANCE = 0.02

CORNERS_C = r"""
/* Targets for tests/e2e/test_netlink_corners.py; "ok ..." lines on stdout, commands on stdin.
 *   leader       says "ok ready PID"; at the next line its main thread starts a second one
 *                and exits (pthread_exit); the second says "ok gone" once the main thread
 *                is gone, then obeys "alloc MIB" and "exit" (says "ok exit VMHWM_BYTES",
 *                read from /proc/thread-self, just before exit(0)).
 *   hold MIB     allocates and touches MIB MiB, says "ok ready PID VMHWM_BYTES", exits at
 *                the next line (or EOF).
 *   parent       "child MIB": forks a child that touches MIB MiB and exits; reaps it, says
 *                "ok child PID VMHWM_BYTES" (the child's, through a pipe). "burst N": N
 *                children that exit at once, reaped; "ok burst". "keep": a child that lives
 *                until the parent exits; "ok keep PID". */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static long long vmhwm(const char *path) {
    char line[256]; long long kb = -1;
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

static char *volatile held;  /* volatile: the compiler may not drop the writes */

static void touch(long mib) {
    size_t n = (size_t)mib << 20;
    volatile char *p = malloc(n);
    for (size_t i = 0; i < n; i += 4096) p[i] = 1;
    held = (char *)p;
}

static void *leader_worker(void *main_thread) {
    char line[64];
    pthread_join(*(pthread_t *)main_thread, NULL);  /* the main thread has exited */
    printf("ok gone\n"); fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "alloc ", 6)) {
            touch(atol(line + 6));
            printf("ok alloc\n"); fflush(stdout);
        } else break;
    }
    printf("ok exit %lld\n", vmhwm("/proc/thread-self/status")); fflush(stdout);
    exit(0);
}

static int leader(void) {
    static pthread_t self, worker;
    char line[64];
    self = pthread_self();
    printf("ok ready %d\n", getpid()); fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 0;
    pthread_create(&worker, NULL, leader_worker, &self);
    pthread_exit(NULL);
}

static int hold(long mib) {
    char line[64];
    touch(mib);
    printf("ok ready %d %lld\n", getpid(), vmhwm("/proc/self/status")); fflush(stdout);
    fgets(line, sizeof line, stdin);
    return 0;
}

static int parent(void) {
    char line[64];
    printf("ok ready %d\n", getpid()); fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "child ", 6)) {
            int fds[2]; long long hwm = -1;
            pipe(fds);
            pid_t pid = fork();
            if (pid == 0) {
                touch(atol(line + 6));
                hwm = vmhwm("/proc/self/status");
                write(fds[1], &hwm, sizeof hwm);
                _exit(0);
            }
            read(fds[0], &hwm, sizeof hwm);
            close(fds[0]); close(fds[1]);
            waitpid(pid, NULL, 0);
            printf("ok child %d %lld\n", pid, hwm); fflush(stdout);
        } else if (!strncmp(line, "burst ", 6)) {
            long n = atol(line + 6);
            for (long i = 0; i < n; i++) {
                pid_t pid = fork();
                if (pid == 0) _exit(0);
                waitpid(pid, NULL, 0);
            }
            printf("ok burst\n"); fflush(stdout);
        } else if (!strncmp(line, "keep", 4)) {
            pid_t pid = fork();
            if (pid == 0) {
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (getppid() == 1) _exit(0);
                pause();
                _exit(0);
            }
            printf("ok keep %d\n", pid); fflush(stdout);
        } else break;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "leader")) return leader();
    if (argc >= 3 && !strcmp(argv[1], "hold")) return hold(atol(argv[2]));
    if (argc >= 2 && !strcmp(argv[1], "parent")) return parent();
    fprintf(stderr, "usage: corners leader | hold MIB | parent\n");
    return 2;
}
"""


def _close(peak: int, hwm: int) -> bool:
    return abs(peak - hwm) <= hwm * TOLERANCE


@pytest.fixture(scope="module")
def corners(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The C target, built once."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on PATH")
    out = tmp_path_factory.mktemp("corners")
    (out / "corners.c").write_text(CORNERS_C)
    subprocess.run([cc, "-O", "-Wall", "-pthread", "-o", str(out / "corners"), str(out / "corners.c")], check=True)
    return str(out / "corners")


class Target:
    """A ``corners`` process over pipes."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pid = proc.pid

    def expect(self, word: str) -> list[str]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        parts = line.split()
        if parts[:2] != ["ok", word]:
            raise AssertionError(f"corners {self.pid}: expected 'ok {word}', got {line!r}")
        return parts[2:]

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def end(self) -> None:
        """Tell it to exit and reap it (its exit record is queued by then)."""
        self.send("exit")
        self.proc.wait(10)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def targets() -> Iterator[Callable[[subprocess.Popen[bytes] | None], Target]]:
    started: list[Target] = []

    def track(proc: subprocess.Popen[bytes] | None) -> Target:
        if proc is None:
            pytest.skip("could not steer the kernel's next PID (ns_last_pid)")
        t = Target(proc)
        started.append(t)
        return t

    yield track
    for t in started:
        t.kill()


class Core:
    """The agent's parts that process events touch, on the kernel's /proc."""

    def __init__(self, patterns: tuple[str, ...] = ()) -> None:
        self.registry = Registry(ProcFS())
        self.scanner = Scanner(self.registry, patterns, label="auto" if patterns else None)
        self.events = ProcessEvents(self.registry, self.scanner)
        self.sampler = Sampler(self.registry, interval=0.1, before_exit=self.events.drain)

    def sample(self) -> list[Watched]:
        return self.sampler.sample(time.time()).exited

    def close(self) -> None:
        self.events.close()
        self.registry.close()


@pytest.fixture
def make_core() -> Iterator[Callable[..., Core]]:
    made: list[Core] = []

    def make(*patterns: str) -> Core:
        core = Core(patterns)
        made.append(core)
        core.events.open()
        if core.events.mode != "netlink":
            pytest.skip(f"cannot listen to process events here: {core.events.note}")
        return core

    yield make
    for core in made:
        core.close()


def _hold(binary: str, mib: int, pid: int | None = None) -> subprocess.Popen[bytes] | None:
    argv = [binary, "hold", str(mib)]
    if pid is not None:
        return spawn_with_pid(pid, argv)
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def _root_only() -> None:
    if os.geteuid() != 0:
        pytest.skip("steering PIDs (ns_last_pid) and listening to netlink need root")


# --------------------------------------------------------------------------- 1. the main thread exits first


def test_what_the_kernel_shows_of_a_process_whose_main_thread_exited(corners: str, targets: Callable[..., Target]
                                                                     ) -> None:
    t = targets(subprocess.Popen([corners, "leader"], stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    pid = int(t.expect("ready")[0])
    t.send("go")
    t.expect("gone")
    t.send("alloc 32")
    t.expect("alloc")
    proc = Path(f"/proc/{pid}")
    # The process's own files follow the main thread: a zombie's, no memory at all...
    assert (proc / "statm").read_text().split() == ["0"] * 7
    status = (proc / "status").read_text()
    assert "State:\tZ (zombie)" in status and "VmHWM" not in status and "Threads:\t2" in status
    # ... but the other thread is there, with the process's memory map.
    (other,) = [tid for tid in os.listdir(proc / "task") if int(tid) != pid]
    assert int((proc / "task" / other / "statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") >= 32 * MiB
    assert "VmHWM" in (proc / "task" / other / "status").read_text()


def test_a_process_whose_main_thread_exits_first_lives_on_and_ends_with_its_exact_peak(
        start_daemon: Callable[..., Daemon], corners: str, targets: Callable[..., Target]) -> None:
    d = start_daemon("--interval", "0.1")
    with d.client() as c:
        if c.status().process_events != "netlink":
            pytest.skip(f"the daemon cannot listen to process events here: {c.status().process_events_note}")
    t = targets(subprocess.Popen([corners, "leader"], stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    pid = int(t.expect("ready")[0])
    with d.client() as c:
        c.attach([pid])
        c.subscribe()
        t.send("go")  # the main thread exits: statm reads as a zombie's from now on
        t.expect("gone")
        t.send("alloc 64")
        t.expect("alloc")
        # Still alive, and measured through its other thread.
        row = wait_sample(c, pid, lambda r: bool(r["alive"]) and int(str(r["rss_bytes"])) >= 64 * MiB)
        assert row["alive"]
        t.send("alloc 32")
        t.expect("alloc")
        t.send("exit")
        hwm = int(t.expect("exit")[0])
        t.proc.wait(10)
        exited = _exited(c, pid)
        (info,) = [p for p in c.list() if p.pid == pid]
    assert not info.alive and info.rss_peak_exact
    for peak in (exited.rss_peak_bytes, info.rss_peak_bytes):
        assert _close(peak, hwm), (peak, hwm)


def test_the_main_threads_exit_record_is_not_the_final_peak(make_core: Callable[..., Core], corners: str,
                                                            targets: Callable[..., Target]) -> None:
    core = make_core()
    t = targets(subprocess.Popen([corners, "leader"], stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    pid = int(t.expect("ready")[0])
    (w,) = core.registry.attach(pid)
    t.send("go")
    t.expect("gone")  # the main thread's exit record (no tgid) is queued
    core.events.drain()
    assert core.sample() == [] and w.alive
    t.send("alloc 64")
    t.expect("alloc")
    assert core.sample() == [] and w.rss >= 64 * MiB
    t.send("exit")
    hwm = int(t.expect("exit")[0])
    t.proc.wait(10)
    # Found gone before its group's record is read (as if it were lost): the main
    # thread's record alone does not make the peak exact.
    core.sampler.before_exit = None
    assert core.sample() == [w]
    assert not w.info().rss_peak_exact
    # The group's record, read late, does.
    core.events.drain()
    assert w.info().rss_peak_exact and _close(w.peak, hwm), (w.peak, hwm)


# --------------------------------------------------------------------------- 2. PID reuse within one tick


def test_a_reused_pid_is_a_new_process_and_each_gets_its_own_record(
        make_core: Callable[..., Core], corners: str, targets: Callable[..., Target]) -> None:
    _root_only()
    core = make_core()
    old = targets(_hold(corners, 96))
    old_hwm = int(old.expect("ready")[1])
    (w_old,) = core.registry.attach(old.pid)
    core.events.drain()
    old.end()
    # Its PID is another process's before the agent's next tick or read of the sockets.
    new = targets(_hold(corners, 16, old.pid))
    new_hwm = int(new.expect("ready")[1])
    (w_new,) = core.registry.attach(new.pid)
    assert w_new is not w_old and w_new.key[1] == _starttime(new.pid) != w_old.key[1]
    assert core.registry.attach(new.pid) == [w_new]  # attaching it again: the same entry
    assert [w.alive for w in core.registry.find(old.pid)] == [True, True]
    # The old one's record goes to the old entry, not to the new one of its PID.
    core.events.drain()
    assert w_new.exit_hwm is None
    assert w_old.exit_hwm is not None and _close(w_old.exit_hwm, old_hwm)
    assert core.sample() == [w_old]
    assert w_old.info().rss_peak_exact and _close(w_old.peak, old_hwm)
    assert w_new.alive and _close(w_new.peak, new_hwm)
    # And the new one's own record to the new entry.
    new.end()
    assert core.sample() == [w_new]
    assert w_new.info().rss_peak_exact and _close(w_new.peak, new_hwm)
    assert _close(w_old.peak, old_hwm)


def test_a_reused_pid_is_matched_as_a_new_process_at_its_exec(make_core: Callable[..., Core], corners: str,
                                                              targets: Callable[..., Target]) -> None:
    _root_only()
    core = make_core("corners")
    old = targets(_hold(corners, 8))
    old.expect("ready")
    core.events.drain()  # its exec: matched, attached
    (w_old,) = core.registry.find(old.pid)
    old.end()
    new = targets(_hold(corners, 8, old.pid))
    new.expect("ready")
    core.events.drain()  # the new process's exec, under the same PID
    (w_new,) = [w for w in core.registry.find(old.pid) if w is not w_old]
    assert (w_new.alive, w_new.key[1], w_new.label) == (True, _starttime(new.pid), "auto")


def _starttime(pid: int) -> int:
    """The process's start, in clock ticks after boot (``/proc/PID/stat``, field 22)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


# --------------------------------------------------------------------------- 3. children reaped early


def test_a_child_reaped_before_its_fork_is_handled(make_core: Callable[..., Core], corners: str,
                                                   targets: Callable[..., Target], caplog: pytest.LogCaptureFixture
                                                   ) -> None:
    _root_only()
    core = make_core()
    parent = targets(subprocess.Popen([corners, "parent"], stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    parent.expect("ready")
    core.registry.attach(parent.pid, label="job", children=True)
    core.events.drain()
    parent.send("child 48")
    child_pid, child_hwm = (int(v) for v in parent.expect("child"))  # it exited and was reaped
    # An unrelated process takes its PID before the agent reads its fork event.
    unrelated = targets(_hold(corners, 8, child_pid))
    unrelated.expect("ready")
    with caplog.at_level(logging.DEBUG):
        core.events.drain()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    (child,) = core.registry.find(child_pid)
    assert (child.alive, child.label, child.name) == (False, "job", "corners")
    assert child.info().rss_peak_exact and _close(child.peak, child_hwm), (child.peak, child_hwm)
    assert core.registry.find_alive(unrelated.pid) is None


# --------------------------------------------------------------------------- 4. overruns


def _tiny_buffer(sock: socket.socket) -> None:
    """The smallest receive buffer the kernel allows (a few KiB): a burst overflows it."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)


def test_after_an_overrun_the_agent_scans_at_once_and_trusts_no_lost_record(
        make_core: Callable[..., Core], corners: str, targets: Callable[..., Target]) -> None:
    _root_only()
    core = make_core()
    source = core.events.source
    assert source is not None
    parent = targets(subprocess.Popen([corners, "parent"], stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    parent.expect("ready")
    core.registry.attach(parent.pid, label="job", children=True)
    watched = targets(_hold(corners, 64))
    watched.expect("ready")
    (w,) = core.registry.attach(watched.pid)
    core.events.drain()
    _tiny_buffer(source.connector)
    _tiny_buffer(source.taskstats)
    parent.send("burst 300")
    parent.expect("burst")
    watched.end()  # its exit record finds the buffer full
    parent.send("keep")  # and this child's fork event too
    (kept,) = (int(v) for v in parent.expect("keep"))
    core.events.drain()
    assert source.event_overruns >= 1 and source.record_overruns >= 1
    assert core.events.overruns == source.event_overruns + source.record_overruns
    # The scan ran at once: the child whose fork was lost is watched.
    assert core.registry.find_alive(kept) is not None
    # Another process under the exited one's PID: its record must not count as the lost one.
    source.taskstats.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    other = targets(_hold(corners, 16, watched.pid))
    other.expect("ready")
    other.end()
    core.events.drain()
    assert core.sample() == [w]
    assert w.exit_hwm is None and not w.info().rss_peak_exact


def test_status_counts_overruns(start_daemon: Callable[..., Daemon], corners: str,
                                targets: Callable[..., Target]) -> None:
    """A daemon stopped while thousands of processes start and end: its sockets overflow."""
    d = start_daemon("--interval", "0.1")
    with d.client() as c:
        if c.status().process_events != "netlink":
            pytest.skip(f"the daemon cannot listen to process events here: {c.status().process_events_note}")
    parent = targets(subprocess.Popen([corners, "parent"], stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    parent.expect("ready")
    d.proc.send_signal(signal.SIGSTOP)
    try:
        parent.send("burst 30000")  # more fork events than the daemon's 8 MiB hold (~12000 here)
        parent.expect("burst")
    finally:
        d.proc.send_signal(signal.SIGCONT)
    with d.client() as c:
        note = c.status().process_events_note or ""
    assert "socket overruns" in note, note
    as_json = json.loads(memagent_cli("status", "--json", "--socket", d.socket).stdout)
    assert as_json["process_events"] == "netlink" and "socket overruns" in as_json["process_events_note"]


def _exited(c: Client, pid: int, max_frames: int = 300) -> Exited:
    for n, frame in enumerate(c.stream()):
        if isinstance(frame, Exited) and frame.pid == pid:
            return frame
        if n >= max_frames:
            break
    raise AssertionError(f"no exited event for {pid} within {max_frames} frames")

