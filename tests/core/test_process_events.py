"""What process events mean for the watched set (:class:`ProcessEvents`), over a fixture
/proc tree, with the records the kernel would send: a followed parent's child attached at
its fork and measured as itself from its exec, ``--auto`` matched at exec, and the exit
record making an exited process's peak exact in whichever order it comes."""

from __future__ import annotations

import os
import re

import pytest
from proctree import TRAINER, WEIRD, GiB, MiB, ProcTree

from memagent.core.autoattach import Scanner
from memagent.core.process_events import LATE_RECORD_S, ProcessEvents
from memagent.core.registry import Registry
from memagent.core.sampler import Sampler
from memagent.core.watched import Watched
from memagent.proc.netlink_msg import EXEC, FORK, ExitStats, ProcEvent
from memagent.proc.procfs import PAGE_SIZE

CHILD = 5000


class Recorder:
    """The registry's events, with the peak each exited event carried."""

    def __init__(self) -> None:
        self.peaks: list[tuple[int, int]] = []

    def attached(self, w: Watched) -> None:
        pass

    def exited(self, w: Watched) -> None:
        self.peaks.append((w.pid, w.peak))

    def detached(self, w: Watched) -> None:
        pass


@pytest.fixture
def events(registry: Registry) -> ProcessEvents:
    return ProcessEvents(registry, Scanner(registry))


def record(pid: int, hwm: int, tgid: int | None = None, *, ppid: int = 0, uid: int = 1000) -> ExitStats:
    return ExitStats(pid, tgid, hwm, "python3", 16, uid=uid, ppid=ppid, btime=1_700_000_000)


# --------------------------------------------------------------------------- fork and exec


def test_a_followed_parents_child_is_attached_at_its_fork(proc_tree: ProcTree, registry: Registry,
                                                          events: ProcessEvents) -> None:
    registry.attach(TRAINER, label="job", children=True)
    # Before its exec the child runs its parent's image: 900 MiB that are not its own.
    proc_tree.add_process(CHILD, "python3", ppid=TRAINER, rss=900 * MiB)
    events.apply([ProcEvent(FORK, CHILD, TRAINER)], [])
    child = registry.find_alive(CHILD)
    assert child is not None and (child.label, child.follow_children, child.pre_exec) == ("job", True, True)
    proc_tree.exec(CHILD, "tool")
    proc_tree.write(CHILD, "cmdline", "tool\0--fast\0")
    proc_tree.set_memory(CHILD, 20 * MiB, hwm=20 * MiB)
    events.apply([ProcEvent(EXEC, CHILD)], [])
    assert (child.name, child.cmdline, child.peak, child.pre_exec) == ("tool", ["tool", "--fast"], 20 * MiB, False)
    # Its own child is followed too; a later exec of a process measured as itself changes nothing.
    proc_tree.add_process(CHILD + 1, "tool", ppid=CHILD)
    events.apply([ProcEvent(FORK, CHILD + 1, CHILD), ProcEvent(EXEC, CHILD)], [])
    assert registry.find_alive(CHILD + 1) is not None
    assert child.peak == 20 * MiB


def test_children_of_a_process_not_followed_are_not_attached(proc_tree: ProcTree, registry: Registry,
                                                             events: ProcessEvents) -> None:
    registry.attach(TRAINER)
    proc_tree.add_process(CHILD, "python3", ppid=TRAINER)
    proc_tree.add_process(CHILD + 1, "python3", ppid=WEIRD)
    events.apply([ProcEvent(FORK, CHILD, TRAINER), ProcEvent(FORK, CHILD + 1, WEIRD)], [])
    assert [w.pid for w in registry.alive] == [TRAINER]


def test_a_child_reaped_before_its_fork_is_heard_is_known_by_its_exit_record(
        registry: Registry, events: ProcessEvents) -> None:
    """No /proc/5000 any more: the child exited and was reaped before the agent read its
    fork. Its exit record, which names its parent, makes it an exited entry."""
    registry.attach(TRAINER, label="job", children=True)
    events.apply([ProcEvent(FORK, CHILD, TRAINER), ProcEvent(FORK, CHILD + 1, TRAINER)],
                 [record(CHILD, GiB, ppid=TRAINER)], now=100.0)
    (child,) = registry.find(CHILD)
    assert (child.alive, child.label, child.name, child.cmdline) == (False, "job", "python3", [])
    assert (child.peak, child.info().rss_peak_exact, child.start_time) == (GiB, True, 1_700_000_000)
    # A record may come in a later batch, within LATE_RECORD_S; one naming another parent
    # is another process's.
    events.apply([], [record(CHILD + 1, 2 * GiB, ppid=WEIRD)], now=101.0)
    assert registry.find(CHILD + 1) == []
    events.apply([], [record(CHILD + 1, 2 * GiB, ppid=TRAINER)], now=101.0 + LATE_RECORD_S)
    assert registry.find(CHILD + 1) == []
    events.apply([ProcEvent(FORK, CHILD + 2, TRAINER)], [], now=110.0)
    events.apply([], [record(CHILD + 2, 2 * GiB, ppid=TRAINER)], now=111.0)
    (late,) = registry.find(CHILD + 2)
    assert (late.peak, late.info().rss_peak_exact) == (2 * GiB, True)


def test_a_pid_taken_by_an_unrelated_process_is_not_the_child(proc_tree: ProcTree, registry: Registry,
                                                              events: ProcessEvents) -> None:
    """The child was reaped and its PID is another process's (not the parent's child)
    when the agent reads the fork: that process is not attached in its place."""
    registry.attach(TRAINER, children=True)
    proc_tree.add_process(CHILD, "unrelated", ppid=WEIRD)
    events.apply([ProcEvent(FORK, CHILD, TRAINER)], [record(CHILD, GiB, ppid=TRAINER)], now=100.0)
    (child,) = registry.find(CHILD)
    assert (child.alive, child.name, child.peak) == (False, "python3", GiB)
    assert registry.find_alive(CHILD) is None


def test_a_child_attached_running_at_its_fork_takes_no_record_of_that_batch(
        proc_tree: ProcTree, registry: Registry, events: ProcessEvents) -> None:
    """A record of its PID read with its fork is an earlier holder's: it had not exited."""
    registry.attach(TRAINER, children=True)
    proc_tree.add_process(CHILD, "python3", ppid=TRAINER, rss=10 * MiB)
    events.apply([ProcEvent(FORK, CHILD, TRAINER)], [record(CHILD, 5 * GiB, ppid=WEIRD)], now=100.0)
    child = registry.find_alive(CHILD)
    assert child is not None and child.exit_hwm is None
    events.apply([], [record(CHILD, 20 * MiB, ppid=TRAINER)], now=100.1)  # its own, later
    assert child.exit_hwm == 20 * MiB


def test_a_child_attached_exited_at_its_fork_takes_its_own_record_of_that_batch(
        proc_tree: ProcTree, registry: Registry, events: ProcessEvents) -> None:
    """Already a zombie when attached: its record is the last of its PID in the batch
    that names its parent (a zombie's PID cannot be reused)."""
    registry.attach(TRAINER, children=True)
    proc_tree.add_process(CHILD, "python3", ppid=TRAINER)
    proc_tree.exit(CHILD)
    events.apply([ProcEvent(FORK, CHILD, TRAINER)],
                 [record(CHILD, 5 * GiB, ppid=WEIRD), record(CHILD, 2 * GiB, ppid=TRAINER)], now=100.0)
    child = registry.find_alive(CHILD)
    assert child is not None and child.exit_hwm == 2 * GiB
    assert child in Sampler(registry, interval=0.1).sample(100.1).exited
    assert (child.peak, child.info().rss_peak_exact) == (2 * GiB, True)


def _set_uids(proc_tree: ProcTree, pid: int, uids: str) -> None:
    proc_tree.write(pid, "status", re.sub(r"^Uid:.*$", f"Uid:\t{uids}", proc_tree.read(pid, "status"), flags=re.M))


def test_at_its_exec_a_child_is_checked_again_against_its_follower(
        proc_tree: ProcTree, registry: Registry, events: ProcessEvents) -> None:
    registry.attach(TRAINER, children=True, may_watch=lambda uid: uid == 1000)
    for pid in (CHILD, CHILD + 1):
        proc_tree.add_process(pid, "python3", ppid=TRAINER, uid=1000)
        for path in (proc_tree.root / str(pid), *(proc_tree.root / str(pid)).iterdir()):
            os.chown(path, 1000, -1)  # as on /proc: a process's files are its owner's
    events.apply([ProcEvent(FORK, CHILD, TRAINER), ProcEvent(FORK, CHILD + 1, TRAINER)], [])
    child = registry.find_alive(CHILD)
    assert child is not None and child.memory_reader == 1000
    # A set-user-ID program: still the user's process (its real UID), but its memory is
    # no longer the user's to read (stacks: root only).
    proc_tree.exec(CHILD, "sudo")
    _set_uids(proc_tree, CHILD, "1000\t0\t0\t0")
    os.chown(proc_tree.path(CHILD, "status"), 0, -1)
    # Another user's process now: no longer watched for this follower.
    proc_tree.exec(CHILD + 1, "other")
    _set_uids(proc_tree, CHILD + 1, "1001\t1001\t1001\t1001")
    events.apply([ProcEvent(EXEC, CHILD), ProcEvent(EXEC, CHILD + 1)], [])
    assert (child.alive, child.uid, child.memory_reader) == (True, 1000, None)
    assert registry.find(CHILD + 1) == []


def test_a_watched_process_that_forks_or_execs_is_told_to_the_sharing_hook(
        proc_tree: ProcTree, registry: Registry, events: ProcessEvents) -> None:
    registry.attach(TRAINER)
    told: list[int] = []
    events.on_sharing_change = told.append
    proc_tree.add_process(CHILD, "python3", ppid=TRAINER)
    events.apply([ProcEvent(FORK, CHILD, TRAINER), ProcEvent(EXEC, TRAINER), ProcEvent(FORK, CHILD + 1, WEIRD),
                  ProcEvent(EXEC, CHILD)], [])
    assert told == [TRAINER, TRAINER]


def test_an_auto_pattern_is_matched_at_exec(proc_tree: ProcTree, registry: Registry) -> None:
    events = ProcessEvents(registry, Scanner(registry, ["trainer"], label="auto"))
    proc_tree.add_process(CHILD, "bash")
    events.apply([ProcEvent(FORK, CHILD, 1), ProcEvent(EXEC, CHILD)], [])
    assert registry.find_alive(CHILD) is None
    proc_tree.exec(CHILD, "trainer")
    events.apply([ProcEvent(EXEC, CHILD)], [])
    w = registry.find_alive(CHILD)
    assert w is not None and w.label == "auto"


# --------------------------------------------------------------------------- exit records


def _exit(proc_tree: ProcTree, sampler: Sampler, pid: int, now: float) -> list[Watched]:
    proc_tree.exit(pid)
    return sampler.sample(now).exited


def test_a_record_before_the_exit_is_seen_makes_the_final_peak_exact(
        proc_tree: ProcTree, registry: Registry, events: ProcessEvents) -> None:
    recorder = Recorder()
    registry.events = recorder
    (w,) = registry.attach(TRAINER, now=100.0)
    sampler = Sampler(registry, interval=0.1)
    sampler.sample(100.1)
    events.apply([], [record(TRAINER, 3 * GiB)], now=100.15)  # it spiked and exited between ticks
    assert (w.alive, w.peak) == (True, 3 * GiB)
    assert _exit(proc_tree, sampler, TRAINER, 100.2) == [w]
    assert (w.peak, w.info().rss_peak_exact, w.row[4]) == (3 * GiB, True, 3 * GiB)
    assert recorder.peaks == [(TRAINER, 3 * GiB)]


def test_a_record_queued_when_the_tick_finds_the_exit_is_taken_first(
        proc_tree: ProcTree, registry: Registry, events: ProcessEvents) -> None:
    recorder = Recorder()
    registry.events = recorder
    (w,) = registry.attach(TRAINER, now=100.0)
    sampler = Sampler(registry, interval=0.1)
    sampler.before_exit = lambda: events.apply([], [record(TRAINER, 3 * GiB)], now=100.2)
    assert _exit(proc_tree, sampler, TRAINER, 100.2) == [w]
    assert (w.peak, w.info().rss_peak_exact) == (3 * GiB, True)
    assert recorder.peaks == [(TRAINER, 3 * GiB)]


def test_without_a_record_an_exited_peak_is_not_exact(proc_tree: ProcTree, registry: Registry) -> None:
    (w,) = registry.attach(TRAINER, now=100.0)
    peak = w.peak
    sampler = Sampler(registry, interval=0.1)
    assert w.info().rss_peak_exact
    assert _exit(proc_tree, sampler, TRAINER, 100.1) == [w]
    assert (w.peak, w.info().rss_peak_exact) == (peak, False)


def test_a_thread_groups_last_record_after_the_exit_still_counts(
        proc_tree: ProcTree, registry: Registry, events: ProcessEvents) -> None:
    """A process with threads: the tick may see it gone while a thread still exits."""
    (w,) = registry.attach(TRAINER, now=100.0)
    sampler = Sampler(registry, interval=0.1)
    _exit(proc_tree, sampler, TRAINER, 100.1)
    events.apply([], [record(TRAINER + 7, 5 * GiB)], now=100.2)  # another thread's, without tgid: no
    assert w.info().rss_peak_exact is False
    events.apply([], [record(TRAINER + 7, 3 * GiB, tgid=TRAINER)], now=100.2)
    assert (w.peak, w.info().rss_peak_exact) == (3 * GiB, True)


THREAD = TRAINER + 8


def _with_thread(proc_tree: ProcTree, pid: int, tid: int) -> None:
    """``task/`` of a process with a second thread: each thread's statm and status are the
    process's (one memory map)."""
    for t in (pid, tid):
        (proc_tree.root / str(pid) / "task" / str(t)).mkdir(parents=True)
        for name in ("statm", "status"):
            proc_tree.write(pid, f"task/{t}/{name}", proc_tree.read(pid, name))


def _thread_memory(proc_tree: ProcTree, pid: int, tid: int, rss: int) -> None:
    pages = rss // PAGE_SIZE
    proc_tree.write(pid, f"task/{tid}/statm", f"{pages * 4 + 1} {pages} 0 1 0 {pages} 0\n")
    status = re.sub(r"^VmHWM:.*$", f"VmHWM:\t{rss // 1024} kB", proc_tree.read(pid, "status"), flags=re.M)
    proc_tree.write(pid, f"task/{tid}/status", re.sub(r"^VmRSS:.*$", f"VmRSS:\t{rss // 1024} kB", status, flags=re.M))


def test_a_process_whose_main_thread_exits_first_lives_on_in_its_other_threads(
        proc_tree: ProcTree, registry: Registry, events: ProcessEvents) -> None:
    """``pthread_exit`` in ``main``: the process's statm reads as a zombie's (it follows
    the main thread) and the main thread's record has no tgid, but the process lives on."""
    (w,) = registry.attach(TRAINER, now=100.0)
    sampler = Sampler(registry, interval=0.1)
    _with_thread(proc_tree, TRAINER, THREAD)
    for statm in ("statm", f"task/{TRAINER}/statm"):
        proc_tree.write(TRAINER, statm, "0 0 0 0 0 0 0\n")
    events.apply([], [record(TRAINER, GiB)], now=100.05)
    assert w.exit_hwm is None
    assert sampler.sample(100.1).exited == [] and w.alive
    # Read through the other thread from then on.
    _thread_memory(proc_tree, TRAINER, THREAD, 3 * GiB)
    assert sampler.sample(100.2).exited == [] and (w.rss, w.peak) == (3 * GiB, 3 * GiB)
    # The last thread exits: its group's record is the final peak.
    proc_tree.write(TRAINER, f"task/{THREAD}/statm", "0 0 0 0 0 0 0\n")
    sampler.before_exit = lambda: events.apply([], [record(THREAD, 4 * GiB, tgid=TRAINER)], now=100.3)
    assert sampler.sample(100.3).exited == [w]
    assert (w.peak, w.info().rss_peak_exact) == (4 * GiB, True)


def test_a_main_threads_record_before_its_groups_is_not_the_final_one(registry: Registry,
                                                                     events: ProcessEvents) -> None:
    """Both in one batch (its threads gone by the time it is read): the group's counts."""
    (w,) = registry.attach(TRAINER, now=100.0)
    events.apply([], [record(TRAINER, GiB), record(THREAD, 2 * GiB, tgid=TRAINER)], now=100.1)
    assert w.exit_hwm == 2 * GiB


def test_a_late_record_is_taken_only_soon_after_the_exit(proc_tree: ProcTree, registry: Registry,
                                                         events: ProcessEvents) -> None:
    (w,) = registry.attach(TRAINER, now=100.0)
    _exit(proc_tree, Sampler(registry, interval=0.1), TRAINER, 100.1)
    events.apply([], [record(TRAINER, 3 * GiB, tgid=TRAINER)], now=100.1 + LATE_RECORD_S + 1)
    assert w.info().rss_peak_exact is False


def test_a_second_record_for_the_pid_is_another_process(proc_tree: ProcTree, registry: Registry,
                                                       events: ProcessEvents) -> None:
    """Its PID reused before the tick saw it gone: the records come in order, its own first."""
    (w,) = registry.attach(TRAINER, now=100.0)
    events.apply([], [record(TRAINER, 2 * GiB), record(TRAINER, 7 * GiB)], now=100.1)
    assert w.peak == 2 * GiB
    _exit(proc_tree, Sampler(registry, interval=0.1), TRAINER, 100.2)
    assert (w.peak, w.info().rss_peak_exact) == (2 * GiB, True)


def test_records_of_processes_not_watched_change_nothing(registry: Registry, events: ProcessEvents) -> None:
    (w,) = registry.attach(TRAINER, now=100.0)
    peak = w.peak
    events.apply([], [record(WEIRD, 5 * GiB), record(WEIRD + 1, 5 * GiB, tgid=WEIRD)], now=100.1)
    assert (w.peak, w.exit_hwm) == (peak, None)


def test_polling_when_disabled_or_on_a_fixture_tree(events: ProcessEvents) -> None:
    assert events.open(enabled=False) == ()
    assert (events.mode, events.note) == ("polling", "disabled by configuration (netlink = false, --no-netlink)")
    assert events.open() == ()
    assert (events.mode, events.note) == ("polling", "not the kernel's /proc (a fixture tree)")
    events.drain()  # nothing to read: nothing happens
