"""core.oom on a fixture /proc: which processes get their label's oom_score_adj, and the
original given back (docs/oom.md, docs/security.md §15). The kernel's own refusals and
the real file are the e2e tests' (tests/e2e/test_oom_score_e2e.py)."""

from __future__ import annotations

import json

from proctree import TRAINER, WEIRD, ProcTree

from memagent.core.oom import OomScores
from memagent.core.registry import Registry
from memagent.core.restore import Saved, restore
from memproto.records import SAMPLE_COLUMNS

ROOTS = 5001  # a process of root's, added to the tree
TABLE = {"detector": -800, "trainer": 800}


def tree_with_scores(proc_tree: ProcTree) -> ProcTree:
    proc_tree.add_process(ROOTS, "python3", uid=0)
    for pid in (TRAINER, WEIRD, ROOTS):
        proc_tree.write(pid, "oom_score_adj", "100\n")
    return proc_tree


def registry_of(proc_tree: ProcTree, trusted: frozenset[int] = frozenset()) -> Registry:
    return Registry(tree_with_scores(proc_tree).procfs(), oom=OomScores(TABLE, trusted))


def adj(proc_tree: ProcTree, pid: int) -> int:
    return int(proc_tree.read(pid, "oom_score_adj"))


def test_roots_process_labelled_by_the_operator_is_lowered_and_given_back_at_detach(proc_tree: ProcTree) -> None:
    reg = registry_of(proc_tree)
    (w,) = reg.attach(ROOTS, label="detector")
    reg.oom.judge(w)
    assert adj(proc_tree, ROOTS) == -800 and w.oom_score_adj == -800 and w.info().oom_score_adj == -800
    assert dict(zip(SAMPLE_COLUMNS, w.row, strict=True))["oom_score_adj"] == -800  # in each tick's row
    assert reg.oom.counts(reg.alive) == (1, 0)
    reg.detach(ROOTS)
    assert adj(proc_tree, ROOTS) == 100  # its own again
    reg.close()


def test_a_lowering_needs_the_operators_label_and_a_trusted_owner(proc_tree: ProcTree) -> None:
    """A user's process (UID 1000) is not lowered, whoever labelled it; root's is not
    lowered by a label that is not the operator's (a non-admin client's)."""
    reg = registry_of(proc_tree)
    (users,) = reg.attach(TRAINER, label="detector")
    (roots,) = reg.attach(ROOTS, label="detector")
    roots.label_trusted = False
    reg.oom.sync(reg.alive, reg.edits)
    assert (adj(proc_tree, TRAINER), adj(proc_tree, ROOTS)) == (100, 100)
    assert (users.oom_score_adj, roots.oom_score_adj) == (None, None) and users.oom_refused and roots.oom_refused
    assert reg.oom.counts(reg.alive) == (0, 2)
    reg.close()


def test_a_trusted_user_is_lowered_and_a_reload_without_it_gives_the_original_back(proc_tree: ProcTree) -> None:
    reg = registry_of(proc_tree, trusted=frozenset({1000}))
    (w,) = reg.attach(TRAINER, label="detector")
    reg.oom.sync(reg.alive, reg.edits)
    assert adj(proc_tree, TRAINER) == -800
    reg.oom.apply(TABLE, frozenset())  # SIGHUP: the user no longer named
    reg.oom.sync(reg.alive, reg.edits)
    assert adj(proc_tree, TRAINER) == 100 and w.oom_score_adj is None and w.oom_refused
    reg.close()


def test_raising_is_written_for_anyone_and_no_entry_touches_nothing(proc_tree: ProcTree) -> None:
    reg = registry_of(proc_tree)
    (raised,) = reg.attach(WEIRD, label="trainer")
    raised.label_trusted = False  # a non-admin client's label: raising is still safe
    (other,) = reg.attach(TRAINER, label="not-in-the-table")
    reg.oom.sync(reg.alive, reg.edits)
    assert (adj(proc_tree, WEIRD), raised.oom_score_adj) == (800, 800)
    assert (adj(proc_tree, TRAINER), other.oom_score_adj, other.oom_refused) == (100, None, None)
    reg.close()  # a clean stop: every original back
    assert adj(proc_tree, WEIRD) == 100


def test_a_relabel_or_an_entry_removed_gives_the_original_back(proc_tree: ProcTree) -> None:
    reg = registry_of(proc_tree)
    (w,) = reg.attach(ROOTS, label="trainer")
    reg.oom.sync(reg.alive, reg.edits)
    assert adj(proc_tree, ROOTS) == 800
    reg.attach(ROOTS, label="detector")  # relabelled: the edits move, the next sync judges it
    reg.oom.sync(reg.alive, reg.edits)
    assert adj(proc_tree, ROOTS) == -800 and w.oom_original == 100
    reg.oom.apply({"trainer": 800}, frozenset())
    reg.oom.sync(reg.alive, reg.edits)
    assert adj(proc_tree, ROOTS) == 100 and w.oom_score_adj is None
    reg.close()


def test_a_process_gone_meanwhile_is_skipped(proc_tree: ProcTree) -> None:
    reg = registry_of(proc_tree)
    (w,) = reg.attach(ROOTS, label="detector")
    proc_tree.path(ROOTS, "oom_score_adj").unlink()  # as /proc/PID of a process that exited
    reg.oom.judge(w)
    assert w.oom_score_adj is None and w.oom_refused is None
    reg.close()


def test_after_a_crash_the_saved_original_is_given_back_not_the_daemons_value(proc_tree: ProcTree) -> None:
    """The daemon wrote -800 and died: the saved state says the process's own was 100."""
    reg = registry_of(proc_tree)
    proc_tree.write(ROOTS, "oom_score_adj", "-800\n")
    starttime = int(proc_tree.read(ROOTS, "stat").split(") ")[1].split()[19])
    entry = Saved(pid=ROOTS, starttime=starttime, start_time=1.0, attached_at=1.0, name="python3",
                  cmdline=["python3"], uid=0, label="detector", label_trusted=True, follow_children=False,
                  alive=True, exited_at=None, peak=0, peak_exact=True, peak_since=1.0, hwm_at_reset=None,
                  oom_original=100)
    assert Saved.from_json(json.loads(json.dumps(entry.to_json()))) == entry
    assert restore(reg, [entry], 2.0) == (1, 0)
    reg.oom.sync(reg.alive, reg.edits)
    (w,) = reg.alive
    assert (w.oom_score_adj, w.oom_original) == (-800, 100)
    reg.detach(ROOTS)
    assert adj(proc_tree, ROOTS) == 100
    reg.close()
