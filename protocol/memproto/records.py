"""The records that frames carry: processes, GPUs, headroom, alerts, stacks, and the
sample row. ``docs/protocol.md`` is their prose twin; :mod:`memproto.frames` wraps them
into frames.

Units: memory in bytes, times in Unix seconds (float), intervals in seconds. A process is
identified by ``(pid, start_time)``: a PID the kernel reuses belongs to a new process.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field

from .schema import wire


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
    pid: int
    start_time: float


@wire
@dataclass(frozen=True, slots=True)
class Series:
    """Peak-preserving RSS history of one process: each slot is the maximum RSS sampled in
    ``step`` seconds; the last slot ends at ``end_time``; oldest first."""

    pid: int
    start_time: float
    end_time: float
    rss_bytes: list[int]


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


@wire
@dataclass(frozen=True, slots=True)
class Alert:
    """An alert (v1.3). The same JSON goes to the hook, ``status --json`` and memtop."""

    #: Increases with every alert the daemon raises; an update of one alert keeps its id.
    id: int
    #: "headroom", "pressure", "leak", "budget" or "oom-kill".
    kind: str
    #: "firing" or "resolved".
    state: str
    #: "warning" or "critical".
    severity: str
    #: "host", a GPU UUID, a label (budget) or "pid:PID" (leak, oom-kill).
    resource: str
    value: float
    threshold: float
    message: str
    time: float
    contributors: list[Contributor]
    #: What value and threshold measure: "ratio", "percent", "bytes", "bytes/min".
    unit: str = ""
    pid: int | None = None
    #: leak: seconds until the headroom is gone at the current pace.
    eta_seconds: float | None = None
    #: oom-kill: "kernel-log", "cgroup" or "inferred".
    source: str | None = None
    #: oom-kill: the process's last RSS samples and stack, as text.
    details: str | None = None
    #: v1.10, oom-kill: whether the victim had the highest OOM score (the kernel's badness,
    #: from the last sampled figures and each ``oom_score_adj``) among the watched processes
    #: in its memory domain (its limited cgroup, else the host); nil: not known.
    oom_highest: bool | None = None
    #: v1.10, oom-kill: the watched process the scores spared: the largest in that domain
    #: (the kernel's pick by size alone) when that was not the victim; nil: none.
    spared: Contributor | None = None


@wire
@dataclass(frozen=True, slots=True)
class DaemonStatus:
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


@wire
@dataclass(frozen=True, slots=True)
class StackFrame:
    """One Python frame (v1.2). ``name`` and ``filename`` are data from the target:
    render them as plain text, never as markup."""

    name: str
    filename: str
    line: int


@wire
@dataclass(frozen=True, slots=True)
class ThreadStack:
    thread_id: int
    name: str | None
    #: py-spy's view: the thread was running (not idle) when read.
    active: bool
    owns_gil: bool
    #: Innermost first.
    frames: list[StackFrame]
    #: v1.7: the kernel's thread ID (``/proc/PID/task/TID``); nil when unknown.
    os_thread_id: int | None = None


@wire
@dataclass(frozen=True, slots=True)
class StackDump:
    """The Python stacks of a process at one moment, read from outside with py-spy."""

    time: float
    #: Why it was taken: "growth", "peak", "demand" or "rotation".
    trigger: str
    rss_bytes: int
    vram_bytes: int | None
    threads: list[ThreadStack]
    #: The thread that growth was attributed to (v1.7: the one given the largest share of
    #: the growth; v1.2 to v1.6: the active one, else the main thread).
    attributed_thread: int | None = None
    #: v1.7: how much the RSS rose while the dump was read (bytes, RSS read just after the
    #: dump minus just before; may be negative); nil when not measured (an older agent).
    #: Positive: the stack was taken while memory was rising.
    rss_rise: int | None = None

    def attributed(self) -> ThreadStack | None:
        """The thread that ``attributed_thread`` names; None when none is named."""
        return next((t for t in self.threads if t.thread_id == self.attributed_thread), None)


@wire
@dataclass(frozen=True, slots=True)
class GrowthSite:
    """Memory growth attributed to code: the sum of the positive RSS and VRAM deltas
    between ticks, each assigned to the first stack taken after it (correlation, not
    causation: see docs/stacks.md). ``line`` is nil in the by-function table."""

    function: str
    filename: str
    line: int | None
    bytes: int
    samples: int


# --------------------------------------------------------------------------- frames


# --------------------------------------------------------------------------- the sample row


@wire
@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One row of a sample frame, by name: **the** declaration of the sample row. The
    column lists and the decoder's per-column type checks below are derived from it.

    Fields without a default are the v1.0 columns, in wire order; fields with a default
    were added later (v1.1: VRAM; v1.5: the peak's exactness) and may be absent from an
    older agent's frames.
    """

    pid: int
    start_time: float
    alive: bool
    rss_bytes: int
    rss_peak_bytes: int
    anon_bytes: int
    swap_bytes: int
    vram_bytes: int | None = None
    vram_peak_bytes: int | None = None
    #: v1.5: ``ProcessInfo.rss_peak_exact`` per tick, so that a client sees a reset-peaks
    #: window turn sampled and exact again, and an exited process's exit record arrive,
    #: without asking ``list``. nil only when absent (an older agent): keep the list's flag.
    rss_peak_exact: bool | None = None
    #: v1.10: ``ProcessInfo.oom_score_adj`` per tick (nil: not set by the daemon, or absent).
    oom_score_adj: int | None = None


_SAMPLE_DECL = dataclasses.fields(ProcessSample)
#: Columns every sample frame carries, in this order in v1.0. Decoders look columns up by
#: name, so a newer agent may append columns.
SAMPLE_FIELDS: tuple[str, ...] = tuple(f.name for f in _SAMPLE_DECL if f.default is dataclasses.MISSING)
#: Columns added later, after those (v1.1: ``vram_bytes``, ``vram_peak_bytes``, int or
#: nil; v1.5: ``rss_peak_exact``, a bool). A frame without them (an older agent) decodes
#: with nil there.
OPTIONAL_SAMPLE_FIELDS: tuple[str, ...] = tuple(f.name for f in _SAMPLE_DECL if f.default is not dataclasses.MISSING)
#: What this version's agent sends.
SAMPLE_COLUMNS: tuple[str, ...] = SAMPLE_FIELDS + OPTIONAL_SAMPLE_FIELDS


def _accepted(tp: object) -> type | tuple[type, ...]:
    """The Python types a decoded msgpack value of field type ``tp`` may have.

    ``bool | None`` is ``bool``: such a column is nil only by its absence (an older agent),
    since the agent always knows a flag; and the decoder refuses a ``bool`` for every kind
    but ``bool`` itself (a ``bool`` is an ``int`` to ``isinstance``), so ``(bool, NoneType)``
    would refuse every value but nil.
    """
    if tp is float:
        return (int, float)  # msgpack keeps 1.0 as a float, but a peer may send 1
    args = typing.get_args(tp)
    if bool in args:  # ``bool | None``
        return bool
    if args:  # ``int | None``
        return tuple(a for a in args if isinstance(a, type))
    assert isinstance(tp, type)
    return tp


#: Per column, the types a value may have; bool is never taken for int.
SAMPLE_CHECKS: dict[str, type | tuple[type, ...]] = {
    name: _accepted(tp) for name, tp in typing.get_type_hints(ProcessSample).items()
}
#: Per column, the exact types (no subclass) of :data:`SAMPLE_CHECKS`'s, as msgpack decodes
#: them: a row whose every value's type is in its column's set passes without ``isinstance``
#: (``Sample.validate``'s fast path; bool is in a set only where it is the column's type).
SAMPLE_EXACT: dict[str, frozenset[type]] = {
    name: frozenset(kind if isinstance(kind, tuple) else (kind,)) for name, kind in SAMPLE_CHECKS.items()
}
