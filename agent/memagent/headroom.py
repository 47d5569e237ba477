"""The headroom model: if every watched process hit its peak at once, would it fit?

Host: ``capacity`` is the configured ``[host] capacity``, else ``limit - reserve -
unwatched``: ``limit`` is total memory, or the memory limit of the cgroup all watched
processes share when smaller; ``unwatched`` is what everything not watched uses now
(used memory minus the watched processes' own part). **Σ peaks** sums over watched
processes (exited ones too, until detached) each one's *share-adjusted* peak:
``peak RSS - (RSS - PSS)``, where ``RSS - PSS`` is the part of its resident memory it
shares with other processes beyond its fair share, from ``smaps_rollup`` read rarely (it
holds the target's mmap lock, ~3.4 µs per resident MiB). Pages shared copy-on-write by
forked workers, and shared libraries, are thus counted once in total instead of once per
process, while memory a process grows later (its own) counts in full. See
``docs/headroom.md`` for the worked example and the limits of this estimate.

GPU: ``capacity = total - reserve - (used - what watched processes use there now)``;
Σ peaks sums the watched processes' peaks on that GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from memproto.records import Contributor, Headroom

from .config import HeadroomConfig
from .gpu import DeviceReading
from .procfs import ProcFS
from .watch import Watched

TOP = 5


def shared_excess(smaps_rollup: bytes) -> int | None:
    """``RSS - PSS`` in bytes from ``/proc/PID/smaps_rollup``: the resident memory this
    process shares beyond its fair share; None when the file says nothing."""
    rss = pss = None
    for line in smaps_rollup.splitlines():
        if line.startswith(b"Rss:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith(b"Pss:"):
            pss = int(line.split()[1]) * 1024
    if rss is None or pss is None:
        return None
    return max(0, rss - pss)


def memory_cgroup(procfs: ProcFS, pid: int) -> str | None:
    """The memory cgroup path of ``pid`` (v1 ``memory`` controller, else v2), or None."""
    try:
        data = procfs.read(pid, "cgroup").decode()
    except OSError:
        return None
    v2 = None
    for line in data.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return f"memory:{path}"
        if controllers == "":
            v2 = f":{path}"
    return v2


def cgroup_file(cgroup: str, v1_name: str, v2_name: str, root: str = "/sys/fs/cgroup") -> str:
    """The path of a memory-controller file of a cgroup from :func:`memory_cgroup`: under
    the v1 ``memory`` hierarchy, or in the v2 unified tree."""
    kind, _, path = cgroup.partition(":")
    path = path.lstrip("/")
    if kind == "memory":
        return os.path.join(root, "memory", path, v1_name)
    return os.path.join(root, path, v2_name)


def cgroup_limit(cgroup: str, root: str = "/sys/fs/cgroup") -> int | None:
    """The memory limit of a cgroup from :func:`memory_cgroup`; None when unlimited."""
    try:
        with open(cgroup_file(cgroup, "memory.limit_in_bytes", "memory.max", root)) as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max":
        return None
    value = int(text)
    return None if value >= 1 << 60 else value  # v1's "unlimited" is a huge number


@dataclass(frozen=True, slots=True)
class HostInputs:
    total: int
    available: int
    cgroup_limit: int | None


def contribution(w: Watched) -> int:
    """The share-adjusted peak a process adds to Σ peaks."""
    return max(0, w.peak - w.shared)


def host_headroom(inputs: HostInputs, watched: list[Watched], config: HeadroomConfig) -> Headroom:
    peaks = [(contribution(w), w) for w in watched]
    sum_peaks = sum(p for p, _ in peaks)
    limit = min(inputs.total, inputs.cgroup_limit) if inputs.cgroup_limit else inputs.total
    used = max(0, inputs.total - inputs.available)
    watched_now = sum(max(0, w.rss - w.shared) for w in watched if w.alive)
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
        top=_top(peaks),
    )


def gpu_headroom(device: DeviceReading, watched: list[Watched], config: HeadroomConfig) -> Headroom:
    peaks = []
    now = 0
    for w in watched:
        p = w.vram_peaks.get(device.index)
        if p is not None and p[0]:
            peaks.append((int(p[0]), w))
        for g in w.vram_gpus:
            if g.index == device.index and g.used_bytes:
                now += g.used_bytes
    sum_peaks = sum(p for p, _ in peaks)
    total = device.total or 0
    unwatched = max(0, (device.used or 0) - now)
    capacity = max(0, total - config.gpu_reserve - unwatched)
    return Headroom(
        resource=device.uuid, name=f"GPU {device.index} {device.name}", capacity_bytes=capacity,
        sum_peaks_bytes=sum_peaks, ratio=sum_peaks / capacity if capacity else None,
        limit_bytes=total, reserve_bytes=config.gpu_reserve, unwatched_bytes=unwatched, configured=False,
        top=_top(peaks),
    )


def _top(peaks: list[tuple[int, Watched]]) -> list[Contributor]:
    best = sorted(peaks, key=lambda pw: -pw[0])[:TOP]
    return [Contributor(w.pid, w.label or w.name, p) for p, w in best]
