"""Processes: what ``list``, ``attach`` and events carry about one watched process, and
the PIDs a request could not serve."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..schema import wire


@wire
@dataclass(frozen=True, slots=True)
class GpuUse:
    """A process's memory on one GPU (v1.1)."""

    index: int
    uuid: str
    #: nil: the driver does not say (shown as n/a, never as 0).
    used_bytes: int | None


@wire
@dataclass(frozen=True, slots=True)
class Container:
    """The container a process runs in (v1.7), from its cgroup path and the engine's files."""

    #: "docker", "podman", "containerd", "cri-o" or "kubernetes" (a pod's container).
    runtime: str
    #: The engine's container ID (64 hex digits).
    id: str
    #: Docker's or Podman's name, a pod's "namespace/pod/container"; nil: not known (yet).
    name: str | None = None


@wire
@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """Everything known about one watched process, as listed by ``memagent ls``."""

    pid: int
    start_time: float
    name: str
    cmdline: list[str]
    label: str | None
    uid: int
    alive: bool
    attached_at: float
    exited_at: float | None
    rss_bytes: int
    rss_peak_bytes: int
    anon_bytes: int
    swap_bytes: int
    #: True when ``rss_peak_bytes`` includes the kernel's high-water mark (it is
    #: max(VmHWM, samples)); False when it is the maximum of the agent's own samples only
    #: (the kernel's mark could not be reset).
    rss_peak_exact: bool = True
    #: Start of the peak window: the process's start time, or the last reset-peaks.
    peak_since: float = 0.0
    #: GPU memory summed over GPUs (v1.1); nil when unknown (no NVML, or the driver gives
    #: no figure); 0 when NVML works and the process holds none.
    vram_bytes: int | None = None
    #: Peak of ``vram_bytes`` over the peak window: per GPU the driver's own high-water mark
    #: where accounting mode is on, else the maximum sampled; nil when never known.
    vram_peak_bytes: int | None = None
    #: True when every GPU's part of the peak comes from the driver's accounting.
    vram_peak_exact: bool = False
    #: Per GPU the process holds memory on.
    gpus: list[GpuUse] = field(default_factory=list)
    #: v1.2: where reading its Python stack stands (see ``StackOk.state``); nil until tried.
    stack_state: str | None = None
    #: v1.7: its memory cgroup's path as /proc/PID/cgroup shows it; its systemd unit; its
    #: container. nil: not known (an older agent, no cgroup), not in a unit, not in one.
    cgroup: str | None = None
    unit: str | None = None
    container: Container | None = None
    #: v1.7: its PID inside its own PID namespace (a container's), when that is nested.
    ns_pid: int | None = None
    #: v1.10: the ``oom_score_adj`` the daemon wrote for it (its label's entry in the
    #: ``[oom_score_adj]`` table; for an exited process, while it ran); nil when the daemon
    #: did not set it (no entry, a lowering refused, an older daemon): never the process's
    #: own value.
    oom_score_adj: int | None = None


@wire
@dataclass(frozen=True, slots=True)
class Failure:
    """One PID of a request that could not be served, and why."""

    pid: int
    code: str
    message: str


@wire
@dataclass(frozen=True, slots=True)
class ProcessRef:
    """A process named by its identity, as a reply lists those it acted on."""

    pid: int
    start_time: float
