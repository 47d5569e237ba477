"""The daemon's status and what it is made of: its schedule, the host's memory, the GPUs."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..schema import wire
from .alert import Alert
from .headroom import Headroom


@wire
@dataclass(frozen=True, slots=True)
class TickStats:
    """How well the sampler keeps its schedule."""

    ticks: int
    mean_interval: float
    max_lateness: float
    overruns: int
    last_duration: float


@wire
@dataclass(frozen=True, slots=True)
class HostMemory:
    """The host's memory and swap, from /proc/meminfo."""

    total_bytes: int
    available_bytes: int
    swap_total_bytes: int
    swap_free_bytes: int


@wire
@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU as NVML reports it (v1.1); ``lost``: it fell off the bus (GpuIsLost)."""

    index: int
    name: str
    uuid: str
    total_bytes: int | None
    used_bytes: int | None
    lost: bool = False


@wire
@dataclass(frozen=True, slots=True)
class DaemonStatus:
    """What ``memagent status`` shows: the daemon, its schedule, the host, GPUs, stacks, headroom and alerts."""

    software: str
    pid: int
    uid: int
    started_at: float
    interval: float
    socket: str
    watched: int
    alive: int
    clients: int
    tick: TickStats
    host: HostMemory
    #: Sample frames dropped for slow clients since the daemon started, all clients together.
    dropped_samples: int = 0
    #: v1.1: whether GPU memory is read (NVML loaded and initialised), the GPUs, and why
    #: not when not ("NVIDIA library not found", "driver not loaded", ...).
    gpu_available: bool = False
    gpus: list[GpuInfo] = field(default_factory=list)
    gpu_note: str | None = None
    #: False when the daemon runs in a nested PID namespace: NVML reports host PIDs, so
    #: per-process GPU memory cannot be matched (run it with the host's PID namespace).
    host_pid_namespace: bool = True
    #: v1.2: py-spy dumps started since the daemon started, and the budget (dumps/s).
    stack_dumps: int = 0
    stack_budget: float = 0.0
    #: v1.2: nil when stacks can be read, else why not ("py-spy not found", "disabled").
    stack_note: str | None = None
    #: v1.3: the headroom of the host and of each GPU; alerts firing now, and ended ones.
    headroom: list[Headroom] = field(default_factory=list)
    alerts_active: list[Alert] = field(default_factory=list)
    alerts_recent: list[Alert] = field(default_factory=list)
    #: v1.3: memory PSI "some avg10" (percent), nil where /proc/pressure is missing.
    pressure: float | None = None
    #: v1.4: where process events come from: "netlink" (the kernel's fork and exec events
    #: and exit records) or "polling" (/proc only); and why not netlink, for humans.
    process_events: str = "polling"
    process_events_note: str | None = None
    #: v1.5: what the daemon failed to read at its last try and works around, for humans,
    #: e.g. a /proc/meminfo that does not parse (the last good reading is used); empty
    #: when all is well.
    faults: list[str] = field(default_factory=list)
    #: v1.6: the flight recorder (docs/recording.md): "on", "paused" (a write failed, e.g.
    #: the disk is full: sampling goes on, ``recording_note`` says why) or "off"; its
    #: directory (nil when off, and for clients that do not see all), and the bytes its
    #: segments hold.
    recording: str = "off"
    recording_dir: str | None = None
    recording_bytes: int = 0
    recording_note: str | None = None
    #: v1.7: where per-process GPU memory comes from: "nvml", "nvmap" (a Jetson's nvmap
    #: debugfs) or "none"; and why that one, for humans.
    gpu_source: str = "none"
    gpu_source_note: str | None = None
    #: v1.7: what samples a growing process's stacks ("austin", "dumps", "off"), why, for
    #: humans, and the Austin bursts started since the daemon started.
    stack_sampler: str = "off"
    stack_sampler_note: str | None = None
    sampler_bursts: int = 0
    #: v1.8: every entry the daemon watches, the caller's or not (``watched`` counts those
    #: the caller may see); nil from an older daemon. The headroom and its Σ peaks are the
    #: whole box's, whatever the caller sees.
    watched_total: int | None = None
    #: v1.10: live processes whose ``oom_score_adj`` the daemon set (``[oom_score_adj]``),
    #: and those whose label's entry would lower it but may not (docs/security.md §15);
    #: counted over the processes the caller may see.
    oom_adjusted: int = 0
    oom_refused: int = 0
    #: v1.11: the CPU budget of all stack work ([stacks] cpu_budget, share of one core),
    #: the share spent over the window (seconds) it is judged over, and the CPU seconds
    #: spent since the daemon started: the daemon's own thread time, its helpers'.
    stack_cpu_budget: float = 0.0
    stack_cpu_rate: float = 0.0
    stack_cpu_window: float = 0.0
    stack_cpu_own_seconds: float = 0.0
    stack_cpu_helper_seconds: float = 0.0
