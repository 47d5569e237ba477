"""The headroom model: if every watched process hit its peak at once, would it fit?

Host: ``capacity`` is the configured ``[host] capacity``, else ``limit - reserve -
unwatched``: ``limit`` is total memory; ``unwatched`` is what everything not watched uses now
(used memory minus the watched processes' own part). **Σ peaks** sums over watched
processes (exited ones too, until detached) each one's *share-adjusted* peak:
``peak RSS - (RSS - PSS)``, where ``RSS - PSS`` is the part of its resident memory it
shares with other processes beyond its fair share, from ``smaps_rollup`` read rarely (it
holds the target's mmap lock, ~3.4 µs per resident MiB). Pages shared copy-on-write by
forked workers, and shared libraries, are thus counted once in total instead of once per
process, while memory a process grows later (its own) counts in full. See
``docs/headroom.md`` for the worked example and the limits of this estimate.

A memory cgroup with a limit (a container's): ``capacity = limit - unwatched``, where
``unwatched`` is the cgroup's working set less its watched processes' own part now; Σ
peaks sums its watched processes' share-adjusted peaks. The host counts them too: each
limit is a line of its own, the box's memory another.

GPU: ``capacity = total - reserve - (used - what watched processes use there now)``;
Σ peaks sums the watched processes' peaks on that GPU.

Unified memory (a Jetson read through nvmap, ``HostInputs.unified``): RAM and GPU memory
are one pool, so there is no GPU headroom; the host's counts each process's GPU memory
with its RSS, peak with peak (``vram_peak``) and now with now (``vram``): what the GPU
holds is then the watched processes' own, not "unwatched". See docs/gpu.md, "Jetson".

Pure: every input is passed in (the engine reads /proc, cgroups and NVML through
:mod:`memagent.proc`), so each function is tested on plain values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from memproto.records import Contributor, Headroom, HostMemory

from ..config import HeadroomConfig
from ..core.watched import Watched
from ..proc.nvml import DeviceReading

TOP = 5


@dataclass(frozen=True, slots=True)
class HostInputs:
    total: int
    available: int
    #: The GPU's memory is this RAM (see the module's docstring).
    unified: bool = False


def host_memory(meminfo: Mapping[str, int]) -> HostMemory:
    """The host's memory as the wire reports it (``status.host``, a recording's headroom
    snapshot), from :meth:`memagent.proc.procfs.ProcFS.meminfo`."""
    return HostMemory(meminfo.get("MemTotal", 0), meminfo.get("MemAvailable", meminfo.get("MemFree", 0)),
                      meminfo.get("SwapTotal", 0), meminfo.get("SwapFree", 0))


def contribution(w: Watched) -> int:
    """The share-adjusted peak a process adds to Σ peaks."""
    return max(0, w.peak - w.shared)


def now_part(w: Watched) -> int:
    """What a live process adds to the total seen together now (``sum_now_bytes``): its
    RSS, share-adjusted as :func:`contribution` adjusts its peak, so that the two bounds
    count the same pages (docs/headroom.md, "Two bounds")."""
    return max(0, w.rss - w.shared)


def budgeted(watched: Iterable[Watched], label: str) -> list[Watched]:
    """The processes whose peaks count in ``label``'s budget: only labels the operator set
    (config, auto-attach, root or admin clients), so that another user cannot push its
    processes into a budget (it may take its own out)."""
    return [w for w in watched if w.label == label and w.label_trusted]


def host_headroom(inputs: HostInputs, watched: list[Watched], config: HeadroomConfig) -> Headroom:
    gpu = inputs.unified
    peaks = [(contribution(w) + ((w.vram_peak or 0) if gpu else 0), w) for w in watched]
    sum_peaks = sum(p for p, _ in peaks)
    limit = inputs.total
    used = max(0, inputs.total - inputs.available)
    nows = [(now_part(w) + ((w.vram or 0) if gpu else 0), w) for w in watched if w.alive]
    watched_now = sum(p for p, _ in nows)
    unwatched = max(0, used - watched_now)
    if config.host_capacity is not None:
        capacity, reserve = config.host_capacity, 0
    else:
        reserve = config.host_reserve
        capacity = max(0, limit - reserve - unwatched)
    return Headroom(
        resource="host", name="host memory", capacity_bytes=capacity, sum_peaks_bytes=sum_peaks,
        ratio=sum_peaks / capacity if capacity else None,
        limit_bytes=limit, reserve_bytes=reserve, unwatched_bytes=unwatched,
        configured=config.host_capacity is not None,
        top=_top(peaks), sum_now_bytes=watched_now, now_top=_top(nows),
    )


@dataclass(frozen=True, slots=True)
class CgroupInputs:
    """A memory cgroup with a limit, as :mod:`.limits` found it."""

    #: ``cgroup:PATH`` (:class:`memproto.vocabulary.Resource`).
    resource: str
    #: For people: ``docker web``, a unit, or the path.
    name: str
    limit: int
    #: Its working set now (:func:`memagent.proc.cgroups.working_set`); None: not known.
    used: int | None


def cgroup_headroom(inputs: CgroupInputs, members: list[Watched]) -> Headroom:
    """A cgroup's limit as a resource: Σ of its watched processes' share-adjusted peaks
    against the limit less what its unwatched processes use now (its working set less the
    watched processes' own part). No reserve: the limit is the kernel's own line, and the
    kernel reclaims the cgroup's page cache before it OOM-kills there."""
    peaks = [(contribution(w), w) for w in members]
    sum_peaks = sum(p for p, _ in peaks)
    nows = [(now_part(w), w) for w in members if w.alive]
    watched_now = sum(p for p, _ in nows)
    unwatched = max(0, inputs.used - watched_now) if inputs.used is not None else 0
    capacity = max(0, inputs.limit - unwatched)
    return Headroom(
        resource=inputs.resource, name=inputs.name, capacity_bytes=capacity, sum_peaks_bytes=sum_peaks,
        ratio=sum_peaks / capacity if capacity else None, limit_bytes=inputs.limit, reserve_bytes=0,
        unwatched_bytes=unwatched, configured=False, top=_top(peaks), sum_now_bytes=watched_now,
        now_top=_top(nows),
    )


def gpu_headroom(device: DeviceReading, watched: list[Watched], config: HeadroomConfig) -> Headroom:
    peaks = []
    nows = []
    for w in watched:
        p = w.vram_peaks.get(device.index)
        if p is not None and p[0]:
            peaks.append((int(p[0]), w))
        mine = sum(g.used_bytes or 0 for g in w.vram_gpus if g.index == device.index)
        if mine:
            nows.append((mine, w))
    now = sum(p for p, _ in nows)
    sum_peaks = sum(p for p, _ in peaks)
    total = device.total or 0
    unwatched = max(0, (device.used or 0) - now)
    capacity = max(0, total - config.gpu_reserve - unwatched)
    return Headroom(
        resource=device.uuid, name=f"GPU {device.index} {device.name}", capacity_bytes=capacity,
        sum_peaks_bytes=sum_peaks, ratio=sum_peaks / capacity if capacity else None,
        limit_bytes=total, reserve_bytes=config.gpu_reserve, unwatched_bytes=unwatched, configured=False,
        top=_top(peaks), sum_now_bytes=now, now_top=_top(nows),
    )


def _top(peaks: list[tuple[int, Watched]]) -> list[Contributor]:
    best = sorted(peaks, key=lambda pw: -pw[0])[:TOP]
    return [Contributor(w.pid, w.display, p) for p, w in best]
