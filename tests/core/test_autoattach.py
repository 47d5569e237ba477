"""Auto-attach (:class:`Scanner`) over a fixture /proc tree: names matched, the agent's own
tools skipped, fork-then-exec caught by rechecks, children of a followed parent attached."""

from __future__ import annotations

import os

from proctree import TRAINER, WEIRD, ZOMBIE, ProcTree

from memagent.core.autoattach import RECHECK_SCANS, Scanner
from memagent.core.registry import Registry


def watched(registry: Registry) -> dict[int, str | None]:
    """PID -> label of the live watched processes."""
    return {w.pid: w.label for w in registry.alive}


def test_a_pattern_matches_the_comm(registry: Registry) -> None:
    scanner = Scanner(registry, ["python*"], label="auto")
    assert scanner.scan() == 1
    assert watched(registry) == {TRAINER: "auto"}
    assert scanner.scan() == 0  # seen: not attached again


def test_a_pattern_matches_the_executable_name(proc_tree: ProcTree, registry: Registry) -> None:
    proc_tree.link_exe(WEIRD, "/opt/models/bin/serve-model")  # its comm says "(weird) name)"
    assert Scanner(registry, ["serve-*"]).scan() == 1
    assert watched(registry) == {WEIRD: None}


def test_its_own_tools_and_itself_are_never_attached(proc_tree: ProcTree, registry: Registry) -> None:
    proc_tree.add_process(5000, "memagent")
    proc_tree.add_process(5001, "memtop")
    me = os.getpid()
    assert me not in (TRAINER, ZOMBIE, WEIRD, 5000, 5001)
    proc_tree.add_process(me, "python3")  # this process, as the agent sees itself
    assert Scanner(registry, ["mem*", "python*"]).scan() == 1
    assert watched(registry) == {TRAINER: None}


def test_an_unmatched_new_pid_is_looked_at_again(proc_tree: ProcTree, registry: Registry) -> None:
    """A process caught between fork and exec carries its parent's name."""
    scanner = Scanner(registry, ["trainer"])
    assert scanner.scan() == 0
    proc_tree.add_process(5000, "bash")  # forked by a shell ...
    assert scanner.scan() == 0
    for _ in range(RECHECK_SCANS - 1):
        assert scanner.scan() == 0
    proc_tree.exec(5000, "trainer")  # ... which exec()s the trainer before the last recheck
    assert scanner.scan() == 1
    assert watched(registry) == {5000: None}


def test_the_rechecks_of_a_new_pid_end(proc_tree: ProcTree, registry: Registry) -> None:
    scanner = Scanner(registry, ["trainer"])
    scanner.scan()
    proc_tree.add_process(5000, "bash")
    for _ in range(1 + RECHECK_SCANS):  # seen, then rechecked RECHECK_SCANS times
        assert scanner.scan() == 0
    proc_tree.exec(5000, "trainer")
    assert scanner.scan() == 0
    assert watched(registry) == {}


def test_children_of_a_followed_parent_are_attached_with_its_label(proc_tree: ProcTree, registry: Registry) -> None:
    registry.attach(TRAINER, label="trainer", children=True)
    assert watched(registry) == {TRAINER: "trainer", ZOMBIE: "trainer", WEIRD: "trainer"}
    scanner = Scanner(registry)  # no pattern: only followed parents make it scan
    proc_tree.add_process(5000, "python3", ppid=TRAINER)  # a new worker
    proc_tree.add_process(5002, "python3", ppid=1)  # unrelated
    assert scanner.scan() == 1
    proc_tree.add_process(5001, "python3", ppid=5000)  # the worker's own child
    assert scanner.scan() == 1
    assert watched(registry) == {TRAINER: "trainer", ZOMBIE: "trainer", WEIRD: "trainer",
                                 5000: "trainer", 5001: "trainer"}
    assert all(w.follow_children for w in registry.alive)


def test_children_are_attached_only_with_the_rights_of_who_followed_the_parent(
    proc_tree: ProcTree, registry: Registry
) -> None:
    registry.attach(TRAINER, children=True, may_watch=lambda uid: uid == 1000)
    assert set(watched(registry)) == {TRAINER, ZOMBIE}  # WEIRD belongs to uid 1001
    proc_tree.add_process(5000, "python3", ppid=TRAINER, uid=1001)
    proc_tree.add_process(5001, "python3", ppid=TRAINER, uid=1000)
    assert Scanner(registry).scan() == 1
    assert set(watched(registry)) == {TRAINER, ZOMBIE, 5001}
