"""The headroom model (:mod:`memagent.alerting.headroom`) on processes watched over a
fixture /proc tree: capacity, share-adjusted Σ peaks, the top contributors, GPUs."""

from __future__ import annotations

import pytest
from proctree import GiB, MiB, ProcTree

from memagent.alerting.headroom import (
    CgroupInputs,
    HostInputs,
    cgroup_headroom,
    contribution,
    gpu_headroom,
    host_headroom,
)
from memagent.config import HeadroomConfig
from memagent.core.registry import Registry
from memagent.core.watched import Watched
from memagent.proc.nvml import DeviceReading
from memproto.records import Contributor, GpuUse

HOST = HostInputs(total=32 * GiB, available=24 * GiB)  # 8 GiB used


def watch(registry: Registry, tree: ProcTree, pid: int, rss: int, peak: int | None = None, shared: int = 0,
          label: str | None = None) -> Watched:
    """Attach a new process ``worker-PID`` whose RSS is ``rss`` and VmHWM ``peak``; ``shared``
    is its RSS - PSS (what the engine reads from smaps_rollup)."""
    tree.add_process(pid, f"worker-{pid}", rss=rss, hwm=peak)
    (w,) = registry.attach(pid, label=label)
    w.shared = shared
    return w


def test_a_configured_capacity_is_used_as_is(proc_tree: ProcTree, registry: Registry) -> None:
    a = watch(registry, proc_tree, 5001, 300 * MiB, peak=500 * MiB)
    b = watch(registry, proc_tree, 5002, 200 * MiB, peak=250 * MiB, shared=50 * MiB)
    view = host_headroom(HOST, [a, b], HeadroomConfig(host_capacity=1 * GiB, host_reserve=512 * MiB))
    assert view.configured and view.resource == "host"
    assert (view.capacity_bytes, view.reserve_bytes, view.limit_bytes) == (1 * GiB, 0, 32 * GiB)
    assert view.sum_peaks_bytes == 500 * MiB + 200 * MiB  # b: peak 250 - shared 50
    assert view.ratio == pytest.approx(700 / 1024)
    assert view.unwatched_bytes == 8 * GiB - (300 + 150) * MiB


def test_a_derived_capacity_is_limit_minus_reserve_minus_unwatched(proc_tree: ProcTree, registry: Registry) -> None:
    """The limit is total memory (a cgroup's limit is a resource of its own, below)."""
    limit = 32 * GiB
    a = watch(registry, proc_tree, 5001, 1 * GiB, peak=2 * GiB)
    view = host_headroom(HostInputs(32 * GiB, 24 * GiB), [a], HeadroomConfig(host_reserve=256 * MiB))
    assert not view.configured
    assert (view.limit_bytes, view.reserve_bytes, view.unwatched_bytes) == (limit, 256 * MiB, 7 * GiB)
    assert view.capacity_bytes == limit - 256 * MiB - 7 * GiB
    assert view.ratio == pytest.approx(2 * GiB / view.capacity_bytes)


@pytest.mark.parametrize(("used", "unwatched"), [(600 * MiB, 150 * MiB), (300 * MiB, 0), (None, 0)])
def test_a_cgroup_limit_is_judged_against_what_its_unwatched_processes_use(
    proc_tree: ProcTree, registry: Registry, used: int | None, unwatched: int
) -> None:
    """capacity = limit - (working set - the watched processes' own part now), no reserve;
    a working set below that part (pages charged elsewhere) or unknown: 0 unwatched."""
    a = watch(registry, proc_tree, 5001, 300 * MiB, peak=500 * MiB)
    b = watch(registry, proc_tree, 5002, 200 * MiB, peak=250 * MiB, shared=50 * MiB)
    view = cgroup_headroom(CgroupInputs("cgroup:/docker/x", "docker web", 1 * GiB, used), [a, b])
    assert (view.resource, view.name, view.limit_bytes, view.reserve_bytes) == ("cgroup:/docker/x", "docker web",
                                                                                1 * GiB, 0)
    assert (view.unwatched_bytes, view.capacity_bytes) == (unwatched, 1 * GiB - unwatched)
    assert view.sum_peaks_bytes == 500 * MiB + 200 * MiB and not view.configured
    assert view.top == [Contributor(5001, "worker-5001", 500 * MiB), Contributor(5002, "worker-5002", 200 * MiB)]


def test_the_contribution_is_the_peak_less_the_shared_part(proc_tree: ProcTree, registry: Registry) -> None:
    """Forked workers' copy-on-write pages are counted once, not once per process."""
    workers = [watch(registry, proc_tree, pid, 400 * MiB, shared=300 * MiB) for pid in (5001, 5002, 5003, 5004)]
    assert [contribution(w) for w in workers] == [100 * MiB] * 4
    workers[0].shared = 500 * MiB  # more shared than its peak (a stale PSS read): never negative
    assert contribution(workers[0]) == 0
    view = host_headroom(HOST, workers, HeadroomConfig(host_capacity=1 * GiB))
    assert view.sum_peaks_bytes == 300 * MiB


def test_exited_processes_count_in_the_sum_until_detached(proc_tree: ProcTree, registry: Registry) -> None:
    a = watch(registry, proc_tree, 5001, 300 * MiB, peak=400 * MiB)
    b = watch(registry, proc_tree, 5002, 200 * MiB, peak=600 * MiB)
    proc_tree.exit(5002)
    registry.mark_exited([b], now=100.0)
    view = host_headroom(HOST, list(registry.entries.values()), HeadroomConfig(host_reserve=0))
    assert view.sum_peaks_bytes == 1000 * MiB  # b's peak still counts ...
    assert view.unwatched_bytes == 8 * GiB - 300 * MiB  # ... but not its last RSS as in use
    assert {c.pid for c in view.top} == {a.pid, b.pid}


def test_no_ratio_without_capacity(proc_tree: ProcTree, registry: Registry) -> None:
    a = watch(registry, proc_tree, 5001, 300 * MiB)
    assert host_headroom(HOST, [a], HeadroomConfig(host_capacity=0)).ratio is None
    derived = host_headroom(HOST, [a], HeadroomConfig(host_reserve=40 * GiB))
    assert derived.capacity_bytes == 0 and derived.ratio is None
    assert host_headroom(HOST, [], HeadroomConfig(host_capacity=1 * GiB)).ratio == 0.0


def test_the_top_five_contributors_biggest_first(proc_tree: ProcTree, registry: Registry) -> None:
    sizes = {5001: 30, 5002: 70, 5003: 10, 5004: 50, 5005: 60, 5006: 20, 5007: 40}
    procs = [watch(registry, proc_tree, pid, mib * MiB, label="bert" if pid == 5002 else None)
             for pid, mib in sizes.items()]
    view = host_headroom(HOST, procs, HeadroomConfig(host_capacity=1 * GiB))
    assert view.top == [
        Contributor(5002, "bert", 70 * MiB), Contributor(5005, "worker-5005", 60 * MiB),
        Contributor(5004, "worker-5004", 50 * MiB), Contributor(5007, "worker-5007", 40 * MiB),
        Contributor(5001, "worker-5001", 30 * MiB),
    ]
    assert view.sum_peaks_bytes == 280 * MiB  # all of them, not only the top


def test_gpu_headroom(proc_tree: ProcTree, registry: Registry) -> None:
    a = watch(registry, proc_tree, 5001, 100 * MiB)
    b = watch(registry, proc_tree, 5002, 100 * MiB)
    a.set_vram([GpuUse(0, "GPU-a", 10 * GiB)], {0: 12 * GiB})  # the driver's accounting: peak 12 GiB
    b.set_vram([GpuUse(0, "GPU-a", 2 * GiB), GpuUse(1, "GPU-b", 5 * GiB)], {})
    h100 = DeviceReading(0, "NVIDIA H100 80GB HBM3", "GPU-a", total=80 * GiB, used=30 * GiB, lost=False,
                         accounting=True)
    view = gpu_headroom(h100, [a, b], HeadroomConfig(gpu_reserve=1 * GiB))
    assert (view.resource, view.name, view.configured) == ("GPU-a", "GPU 0 NVIDIA H100 80GB HBM3", False)
    assert view.unwatched_bytes == 30 * GiB - 12 * GiB  # used now minus what the watched use there now
    assert view.capacity_bytes == 80 * GiB - 1 * GiB - 18 * GiB
    assert view.sum_peaks_bytes == 14 * GiB
    assert view.ratio == pytest.approx(14 / 61)
    assert view.top == [Contributor(5001, "worker-5001", 12 * GiB), Contributor(5002, "worker-5002", 2 * GiB)]
    other = DeviceReading(1, "NVIDIA A100", "GPU-b", total=40 * GiB, used=None, lost=False, accounting=False)
    view = gpu_headroom(other, [a, b], HeadroomConfig(gpu_reserve=0))
    assert (view.sum_peaks_bytes, view.unwatched_bytes, view.capacity_bytes) == (5 * GiB, 0, 40 * GiB)


def test_on_unified_memory_gpu_peaks_count_in_the_host_headroom(proc_tree: ProcTree, registry: Registry) -> None:
    """A Jetson (nvmap): what the GPU holds is RAM used by the watched processes, not
    unwatched; their GPU peaks add to their RAM peaks against one capacity."""
    a = watch(registry, proc_tree, 5001, 1 * GiB, peak=2 * GiB)
    b = watch(registry, proc_tree, 5002, 512 * MiB, peak=512 * MiB)
    a.set_vram([GpuUse(0, "nvmap", 3 * GiB)], {})  # peak 3 GiB, then 1 GiB now
    a.set_vram([GpuUse(0, "nvmap", 1 * GiB)], {})
    b.set_vram([], {})  # none
    config = HeadroomConfig(host_reserve=0)
    split = host_headroom(HostInputs(32 * GiB, 24 * GiB), [a, b], config)
    unified = host_headroom(HostInputs(32 * GiB, 24 * GiB, unified=True), [a, b], config)
    assert split.sum_peaks_bytes == 2 * GiB + 512 * MiB
    assert unified.sum_peaks_bytes == 2 * GiB + 3 * GiB + 512 * MiB
    # 8 GiB used: 1.5 GiB RSS watched; unified, a's 1 GiB on the GPU is watched too.
    assert split.unwatched_bytes == 8 * GiB - 1536 * MiB
    assert unified.unwatched_bytes == 8 * GiB - 2560 * MiB
    assert unified.capacity_bytes == 32 * GiB - unified.unwatched_bytes
    assert unified.top[0] == Contributor(5001, "worker-5001", 5 * GiB)
