"""Every frame of protocol v1, as frozen dataclasses. ``docs/protocol.md`` is their prose twin.

Units: memory in bytes, times in Unix seconds (float), intervals in seconds. A process is
identified by ``(pid, start_time)``: a PID the kernel reuses belongs to a new process.

Frame classes carry their wire tag in ``TYPE``. Requests (client to server) carry an
``id`` that the server's reply repeats. Events are pushed by the server to subscribers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from .errors import ProtocolError
from .schema import wire

# --------------------------------------------------------------------------- shared parts


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

    #: "host", or the GPU's UUID.
    resource: str
    name: str
    capacity_bytes: int
    #: Σ of the watched processes' peaks (host: share-adjusted, see docs/headroom.md).
    sum_peaks_bytes: int
    #: sum_peaks / capacity; nil when the capacity is 0.
    ratio: float | None
    #: Total memory (or the cgroup limit, or the GPU's total) the capacity comes from.
    limit_bytes: int
    reserve_bytes: int
    #: What processes that are not watched use now.
    unwatched_bytes: int
    #: True when the capacity is the configured ``[host] capacity``.
    configured: bool
    top: list[Contributor]


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
    #: The thread that growth was attributed to (the active one, else the main thread).
    attributed_thread: int | None = None


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


@dataclass(frozen=True, slots=True)
class Frame:
    """Base of all frames; ``TYPE`` is the wire tag."""

    TYPE: ClassVar[str] = ""

    def validate(self) -> None:
        """Cross-field checks beyond field types; raise :class:`ProtocolError`."""


@wire
@dataclass(frozen=True, slots=True)
class Hello(Frame):
    """First frame in each direction. ``version`` is ``[major, minor]``."""

    TYPE: ClassVar[str] = "hello"
    version: list[int]
    role: str
    software: str
    #: Server only: the sample interval in seconds.
    interval: float | None = None
    #: Server only: the daemon's PID.
    pid: int | None = None

    def validate(self) -> None:
        if len(self.version) != 2:
            raise ProtocolError("expected [major, minor]", frame=self.TYPE, field="version")
        if self.role not in ("client", "server"):
            raise ProtocolError("expected 'client' or 'server'", frame=self.TYPE, field="role")


# Requests ---------------------------------------------------------------------------


@wire
@dataclass(frozen=True, slots=True)
class Attach(Frame):
    TYPE: ClassVar[str] = "attach"
    id: int
    pids: list[int]
    label: str | None = None
    #: Also watch the current descendants, and follow children forked later.
    children: bool = False


@wire
@dataclass(frozen=True, slots=True)
class Detach(Frame):
    TYPE: ClassVar[str] = "detach"
    id: int
    pids: list[int]
    #: Also detach every exited process the caller may see.
    exited: bool = False


@wire
@dataclass(frozen=True, slots=True)
class ResetPeaks(Frame):
    TYPE: ClassVar[str] = "reset_peaks"
    id: int
    pids: list[int]


@wire
@dataclass(frozen=True, slots=True)
class ListProcesses(Frame):
    TYPE: ClassVar[str] = "list"
    id: int


@wire
@dataclass(frozen=True, slots=True)
class Subscribe(Frame):
    TYPE: ClassVar[str] = "subscribe"
    id: int


@wire
@dataclass(frozen=True, slots=True)
class Unsubscribe(Frame):
    TYPE: ClassVar[str] = "unsubscribe"
    id: int


@wire
@dataclass(frozen=True, slots=True)
class History(Frame):
    TYPE: ClassVar[str] = "history"
    id: int
    #: Empty: every process the caller may see.
    pids: list[int] = field(default_factory=list)
    #: How far back; nil: everything kept.
    seconds: float | None = None


@wire
@dataclass(frozen=True, slots=True)
class Stack(Frame):
    """v1.2: the Python stacks of a watched process. With ``fresh`` the agent takes a new
    dump first (within its dump budget) and replies when it has it."""

    TYPE: ClassVar[str] = "stack"
    id: int
    pid: int
    fresh: bool = True


@wire
@dataclass(frozen=True, slots=True)
class Status(Frame):
    TYPE: ClassVar[str] = "status"
    id: int


# Replies ----------------------------------------------------------------------------


@wire
@dataclass(frozen=True, slots=True)
class AttachOk(Frame):
    TYPE: ClassVar[str] = "attach_ok"
    id: int
    attached: list[ProcessInfo]
    failed: list[Failure]


@wire
@dataclass(frozen=True, slots=True)
class DetachOk(Frame):
    TYPE: ClassVar[str] = "detach_ok"
    id: int
    detached: list[ProcessRef]
    failed: list[Failure]


@wire
@dataclass(frozen=True, slots=True)
class ResetPeaksOk(Frame):
    TYPE: ClassVar[str] = "reset_peaks_ok"
    id: int
    reset: list[ProcessInfo]
    failed: list[Failure]


@wire
@dataclass(frozen=True, slots=True)
class ListOk(Frame):
    TYPE: ClassVar[str] = "list_ok"
    id: int
    processes: list[ProcessInfo]


@wire
@dataclass(frozen=True, slots=True)
class HistoryOk(Frame):
    TYPE: ClassVar[str] = "history_ok"
    id: int
    step: float
    series: list[Series]


@wire
@dataclass(frozen=True, slots=True)
class StatusOk(Frame):
    TYPE: ClassVar[str] = "status_ok"
    id: int
    status: DaemonStatus


@wire
@dataclass(frozen=True, slots=True)
class StackOk(Frame):
    TYPE: ClassVar[str] = "stack_ok"
    id: int
    pid: int
    start_time: float
    #: "ok", "pending", "not_python", "permission_denied", "py_spy_missing", "unsupported",
    #: "exited", "timeout", "error" or "disabled".
    state: str
    #: What went wrong and how to fix it, or nil.
    message: str | None
    latest: StackDump | None
    at_peak: StackDump | None
    by_line: list[GrowthSite]
    by_function: list[GrowthSite]


@wire
@dataclass(frozen=True, slots=True)
class Ack(Frame):
    """Reply to requests that return nothing but success (subscribe, unsubscribe)."""

    TYPE: ClassVar[str] = "ack"
    id: int


@wire
@dataclass(frozen=True, slots=True)
class Error(Frame):
    """A request failed as a whole (``id`` is the request's), or a frame could not be tied
    to a request (``id`` nil). After codes ``protocol``, ``too_large`` (from the client),
    ``version`` and ``busy`` the server closes the connection."""

    TYPE: ClassVar[str] = "error"
    id: int | None
    code: str
    message: str


# Events -----------------------------------------------------------------------------

#: Columns every sample frame carries, in this order in v1.0. Decoders look columns up by
#: name, so a newer agent may append columns.
SAMPLE_FIELDS: tuple[str, ...] = (
    "pid",
    "start_time",
    "alive",
    "rss_bytes",
    "rss_peak_bytes",
    "anon_bytes",
    "swap_bytes",
)
#: Columns added in v1.1, after those: int or nil. A frame without them (an older agent)
#: decodes with nil there.
OPTIONAL_SAMPLE_FIELDS: tuple[str, ...] = ("vram_bytes", "vram_peak_bytes")
#: What this version's agent sends.
SAMPLE_COLUMNS: tuple[str, ...] = SAMPLE_FIELDS + OPTIONAL_SAMPLE_FIELDS


@wire
@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One row of a sample frame, by name."""

    pid: int
    start_time: float
    alive: bool
    rss_bytes: int
    rss_peak_bytes: int
    anon_bytes: int
    swap_bytes: int
    vram_bytes: int | None = None
    vram_peak_bytes: int | None = None


_ROW_CHECKS: dict[str, type | tuple[type, ...]] = {
    "pid": int,
    "start_time": (int, float),
    "alive": bool,
    "rss_bytes": int,
    "rss_peak_bytes": int,
    "anon_bytes": int,
    "swap_bytes": int,
    "vram_bytes": (int, type(None)),
    "vram_peak_bytes": (int, type(None)),
}


@wire
@dataclass(frozen=True, slots=True)
class Sample(Frame):
    """One tick: a row per watched process (exited ones too, frozen at their last values)."""

    TYPE: ClassVar[str] = "sample"
    seq: int
    time: float
    interval: float
    fields: list[str]
    rows: list[list[Any]]

    def validate(self) -> None:
        missing = [name for name in SAMPLE_FIELDS if name not in self.fields]
        if missing:
            raise ProtocolError(f"missing column {missing[0]!r}", frame=self.TYPE, field="fields")
        width = len(self.fields)
        where = [(self.fields.index(name), name, kind) for name, kind in _ROW_CHECKS.items() if name in self.fields]
        for r, row in enumerate(self.rows):
            if len(row) != width:
                raise ProtocolError(
                    f"row has {len(row)} values for {width} columns", frame=self.TYPE, field=f"rows[{r}]"
                )
            for col, name, kind in where:
                value = row[col]
                if not isinstance(value, kind) or (kind is not bool and type(value) is bool):
                    raise ProtocolError(
                        f"column {name!r} has a {type(value).__name__}", frame=self.TYPE, field=f"rows[{r}]"
                    )

    def records(self) -> list[ProcessSample]:
        """Rows as :class:`ProcessSample`, ignoring columns this version does not know."""
        idx = [self.fields.index(name) for name in SAMPLE_FIELDS]
        extra = [self.fields.index(name) if name in self.fields else -1 for name in OPTIONAL_SAMPLE_FIELDS]
        if all(i >= 0 for i in extra):
            idx += extra
            return [
                ProcessSample(row[idx[0]], float(row[idx[1]]), *(row[i] for i in idx[2:]))  # type: ignore[arg-type]
                for row in self.rows
            ]
        return [
            ProcessSample(
                row[idx[0]], float(row[idx[1]]), *(row[i] for i in idx[2:]),  # type: ignore[arg-type]
                *(row[i] if i >= 0 else None for i in extra),
            )
            for row in self.rows
        ]


@wire
@dataclass(frozen=True, slots=True)
class Attached(Frame):
    TYPE: ClassVar[str] = "attached"
    process: ProcessInfo


@wire
@dataclass(frozen=True, slots=True)
class Exited(Frame):
    TYPE: ClassVar[str] = "exited"
    pid: int
    start_time: float
    #: When the agent noticed the exit.
    time: float
    rss_peak_bytes: int


@wire
@dataclass(frozen=True, slots=True)
class Detached(Frame):
    TYPE: ClassVar[str] = "detached"
    pid: int
    start_time: float


@wire
@dataclass(frozen=True, slots=True)
class StackStateChanged(Frame):
    """v1.2: a watched process's stack state changed (e.g. to "permission_denied")."""

    TYPE: ClassVar[str] = "stack_state"
    pid: int
    start_time: float
    state: str
    message: str | None


@wire
@dataclass(frozen=True, slots=True)
class AlertRaised(Frame):
    """v1.3: an alert fired, changed severity, or resolved."""

    TYPE: ClassVar[str] = "alert"
    alert: Alert


@wire
@dataclass(frozen=True, slots=True)
class Dropped(Frame):
    """Sent before the next sample when this client was too slow: ``count`` is the total
    number of sample frames dropped for it since it connected."""

    TYPE: ClassVar[str] = "dropped"
    count: int


REQUESTS: tuple[type[Frame], ...] = (
    Attach, Detach, ResetPeaks, ListProcesses, Subscribe, Unsubscribe, History, Status, Stack,
)
REPLIES: tuple[type[Frame], ...] = (
    AttachOk, DetachOk, ResetPeaksOk, ListOk, HistoryOk, StatusOk, StackOk, Ack, Error,
)
EVENTS: tuple[type[Frame], ...] = (Sample, Attached, Exited, Detached, Dropped, StackStateChanged, AlertRaised)
_ALL: tuple[type[Frame], ...] = (Hello, *REQUESTS, *REPLIES, *EVENTS)
FRAME_TYPES: dict[str, type[Frame]] = {cls.TYPE: cls for cls in _ALL}
