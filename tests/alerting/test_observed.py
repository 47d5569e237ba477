"""The observed bound (:mod:`memagent.alerting.observed`): the highest total seen at one
tick beside Σ peaks, folded by the alert engine tick by tick over a fixture /proc tree
(the real sampler and engine), and the fold itself on plain values."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from proctree import MiB, ProcTree
from test_engine import Box

from memagent.alerting.observed import HighestTogether, Together, moments_of
from memagent.core.registry import Registry
from memproto.records import Contributor, Headroom

A, B = 5001, 5002


@pytest.fixture
def fleet(proc_tree: ProcTree, registry: Registry, tmp_path: Path) -> Iterator[Box]:
    b = Box(proc_tree, registry, tmp_path / "kmsg", capacity=1000 * MiB)
    b.start(A, 100 * MiB)
    b.start(B, 100 * MiB)
    yield b
    b.engine.close()


def host(box: Box) -> Headroom:
    return next(h for h in box.engine.headroom if h.resource == "host")


async def test_peaks_that_alternate_are_seen_apart_and_together_once_they_overlap(fleet: Box) -> None:
    await fleet.tick(1000.0)
    for n, pid in enumerate((A, B)):  # each peaks at 300 MiB while the other idles at 100
        fleet.tree.set_memory(pid, 300 * MiB)
        await fleet.tick(1001.0 + n)
        fleet.tree.set_memory(pid, 100 * MiB, hwm=300 * MiB)
        await fleet.tick(1001.5 + n)
    apart = host(fleet)
    assert apart.sum_peaks_bytes == 600 * MiB  # every peak at once
    assert (apart.observed_sum_max_bytes, apart.observed_sum_max_at) == (400 * MiB, 1001.0)  # the first of two ties
    assert apart.observed_top == [Contributor(A, f"worker-{A}", 300 * MiB), Contributor(B, f"worker-{B}", 100 * MiB)]
    assert apart.sum_now_bytes == 200 * MiB

    fleet.tree.set_memory(A, 300 * MiB)
    fleet.tree.set_memory(B, 300 * MiB)
    await fleet.tick(1003.0)
    together = host(fleet)
    assert together.observed_sum_max_bytes == together.sum_peaks_bytes == 600 * MiB
    assert together.observed_sum_max_at == 1003.0


async def test_the_headroom_alert_names_both_bounds(fleet: Box) -> None:
    await fleet.tick(1000.0)
    fleet.tree.set_memory(A, 800 * MiB)
    await fleet.tick(1000.5)
    fleet.tree.set_memory(A, 100 * MiB, hwm=800 * MiB)
    fleet.tree.set_memory(B, 400 * MiB)
    await fleet.tick(1001.0)  # Σ peaks 1200 MiB of 1000: critical; seen together at most 900
    (alert, *_) = fleet.fired("headroom")
    assert alert.message.startswith("Σ peaks ")
    latest = fleet.fired("headroom")[-1]
    assert "would use 120% of the 1000 MiB headroom of host memory; seen together at most 900 MiB (90%)" \
        in latest.message


async def test_a_total_with_unknown_sharing_is_not_folded(proc_tree: ProcTree, registry: Registry,
                                                          tmp_path: Path) -> None:
    """Its shared pages would count in full: a maximum too high, so none is kept."""
    box = Box(proc_tree, registry, tmp_path / "kmsg", capacity=1000 * MiB)
    box.start(A, 100 * MiB, pss=False)
    proc_tree.set_memory(A, 300 * MiB)
    await box.tick(1000.0)
    view = host(box)
    assert view.sum_now_bytes is None and view.observed_sum_max_bytes is None
    box.engine.close()


def test_the_fold_keeps_the_highest_and_the_state_file_form_round_trips() -> None:
    fold = HighestTogether()
    fold.see("host", Together(1.0, 10, (Contributor(1, "a", 10),)))
    fold.see("host", Together(2.0, 10))  # a tie keeps the earlier moment
    fold.see("host", Together(3.0, 5))
    fold.see("GPU-x", Together(4.0, 7))
    assert fold.best["host"] == Together(1.0, 10, (Contributor(1, "a", 10),)) and fold.version == 2
    assert HighestTogether.from_json(fold.to_json()).best == fold.best
    for bad in ([], {"host": {"at": 1.0}}, {"host": {"at": 1.0, "bytes": -1}}, {"host": "x"}):
        with pytest.raises(ValueError):
            HighestTogether.from_json(bad)


def test_a_snapshot_tells_its_total_then_and_the_daemons_maximum_with_its_moment() -> None:
    view = Headroom("host", "host memory", 100, 90, 0.9, 200, 0, 0, True, [], sum_now_bytes=40,
                    observed_sum_max_bytes=70, observed_sum_max_at=5.0,
                    observed_top=[Contributor(1, "a", 70)])
    assert list(moments_of(9.0, [view])) == [("host", Together(9.0, 40)),
                                             ("host", Together(5.0, 70, (Contributor(1, "a", 70),)))]
    older = Headroom("host", "host memory", 100, 90, 0.9, 200, 0, 0, True, [])  # a 1.8 daemon's
    assert list(moments_of(9.0, [older])) == []
