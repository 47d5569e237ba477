"""Every frame of protocol v1, as frozen dataclasses. ``docs/protocol.md`` is their prose twin.

Frame classes carry their wire tag in ``TYPE``. Requests (client to server) carry an
``id`` that the server's reply repeats. Events are pushed by the server to subscribers.
The records frames carry (processes, alerts, stacks, the sample row) are declared in
:mod:`memproto.records` and re-exported here, so one import gives a peer the whole wire.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from .errors import ProtocolError
from .records import (
    OPTIONAL_SAMPLE_FIELDS,
    SAMPLE_CHECKS,
    SAMPLE_COLUMNS,
    SAMPLE_EXACT,
    SAMPLE_FIELDS,
    Alert,
    DaemonStatus,
    Failure,
    GrowthSite,
    ProcessInfo,
    ProcessRef,
    ProcessSample,
    Series,
    StackDump,
)
from .schema import wire


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
    #: v1.7, at most one: also every process, now and later, whose memory cgroup is this
    #: path or below it / whose systemd unit is this / in this container (name, or ID or
    #: its first 12+ hex digits).
    cgroup: str | None = None
    unit: str | None = None
    container: str | None = None


@wire
@dataclass(frozen=True, slots=True)
class Detach(Frame):
    TYPE: ClassVar[str] = "detach"
    id: int
    pids: list[int]
    #: Also detach every exited process the caller may see.
    exited: bool = False
    #: v1.7: end the rule of ``attach`` for this group, and detach its processes now.
    cgroup: str | None = None
    unit: str | None = None
    container: str | None = None


@wire
@dataclass(frozen=True, slots=True)
class ResetPeaks(Frame):
    TYPE: ClassVar[str] = "reset_peaks"
    id: int
    pids: list[int]
    #: Also reset the kernel's VmHWM (clear_refs): exact at once, but it resets the
    #: target's own ru_maxrss; refused for PID 1 and processes not the caller's own.
    kernel: bool = False


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
    #: v1.7: group rules ended (``detach`` with cgroup, unit or container).
    rules_ended: int = 0


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
    #: v1.7: "ok" (``at_peak`` was taken while memory rose to the peak), "missed" (no stack
    #: was taken during that rise: ``at_peak`` is nil), nil (no rise to a new peak seen yet).
    stack_at_peak_state: str | None = None


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
        where = [(self.fields.index(name), name, kind) for name, kind in SAMPLE_CHECKS.items()
                 if name in self.fields]
        # The rows' shapes (each value's exact type) are a handful per frame: checked once
        # each, a frame of 1000 rows costs a tenth of checking every value (a replay reads
        # hours of them). A shape with a type not listed exactly (a subclass) is checked
        # value by value below, as is every frame with a bad row, for its message.
        exact = [(col, SAMPLE_EXACT[name]) for col, name, _ in where]
        if all(len(shape) == width and all(shape[col] in ok for col, ok in exact)
               for shape in {tuple(map(type, row)) for row in self.rows}):
            return
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

    def column_index(self) -> dict[str, int]:
        """Where each of :data:`SAMPLE_COLUMNS` is in this frame's rows (-1: absent, an
        older agent's frame): for a reader that takes the values it needs from each row
        without a record a row (memtop: 1000 processes a tick, or hours of them replayed)."""
        return {name: self.fields.index(name) if name in self.fields else -1 for name in SAMPLE_COLUMNS}

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

