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


def record(pid: int, hwm: int, tgid: int | None = None) -> ExitStats:
    return ExitStats(pid, tgid, hwm, "python3", 16)


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


def test_a_child_gone_before_its_fork_is_heard_is_skipped(registry: Registry, events: ProcessEvents) -> None:
    registry.attach(TRAINER, children=True)
    events.apply([ProcEvent(FORK, CHILD, TRAINER)], [record(CHILD, GiB)])  # no /proc/5000
    assert registry.find(CHILD) == []


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
    return sampler.sample(now)


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
