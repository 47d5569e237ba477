"""Would the peaks fit: the headroom of the host, each memory cgroup limit and each GPU."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..schema import wire


@wire
@dataclass(frozen=True, slots=True)
class Contributor:
    """A process's part in a Σ of peaks (v1.3)."""

    pid: int
    label: str
    peak_bytes: int


@wire
@dataclass(frozen=True, slots=True)
class Headroom:
    """Would the peaks fit? For the host or one GPU (v1.3); see docs/headroom.md."""

    #: "host", the GPU's UUID, or (v1.7) "cgroup:PATH", a memory cgroup's limit.
    resource: str
    name: str
    capacity_bytes: int
    #: Σ of the watched processes' peaks (host: share-adjusted, see docs/headroom.md).
    sum_peaks_bytes: int
    #: sum_peaks / capacity; nil when the capacity is 0.
    ratio: float | None
    #: Total memory (or the GPU's total, or the cgroup's limit) the capacity comes from.
    limit_bytes: int
    reserve_bytes: int
    #: What processes that are not watched use now.
    unwatched_bytes: int
    #: True when the capacity is the configured ``[host] capacity``.
    configured: bool
    top: list[Contributor]
    #: v1.9: the watched processes' memory together now, counted as Σ peaks counts their
    #: peaks (host: share-adjusted); nil from an older daemon, or while a process's sharing
    #: is not yet known (it would count shared pages in full).
    sum_now_bytes: int | None = None
    #: v1.9: the largest parts of ``sum_now_bytes``, at most 5 (``peak_bytes``: its part now).
    now_top: list[Contributor] = field(default_factory=list)
    #: v1.9: the highest ``sum_now_bytes`` seen at one tick over the daemon's window (kept
    #: across restarts): a lower bound of what the peaks need together, Σ peaks the upper.
    observed_sum_max_bytes: int | None = None
    #: v1.9: when it was seen (Unix seconds).
    observed_sum_max_at: float | None = None
    #: v1.9: the largest parts of it then, at most 5.
    observed_top: list[Contributor] = field(default_factory=list)
