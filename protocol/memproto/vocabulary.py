"""The words both ends of the wire use for states and kinds: one place, so the agent and
memtop (and a client in another language, through ``docs/protocol.md``) never spell them
differently. Plain ``str`` constants: they travel as msgpack strings and compare equal
to what a peer sends.
"""

from __future__ import annotations

from typing import Final


class StackState:
    """Where reading a process's Python stack stands (``ProcessInfo.stack_state``,
    ``StackOk.state``, ``StackStateChanged.state``)."""

    OK: Final = "ok"
    PENDING: Final = "pending"
    NOT_PYTHON: Final = "not_python"
    DENIED: Final = "permission_denied"
    MISSING: Final = "py_spy_missing"
    UNSUPPORTED: Final = "unsupported"
    EXITED: Final = "exited"
    TIMEOUT: Final = "timeout"
    ERROR: Final = "error"
    DISABLED: Final = "disabled"
    #: States in which asking for a stack again is pointless until something changes.
    FINAL: Final = frozenset({NOT_PYTHON, MISSING, DISABLED, EXITED})


class StackTrigger:
    """Why a stack dump was taken (``StackDump.trigger``)."""

    DEMAND: Final = "demand"
    PEAK: Final = "peak"
    GROWTH: Final = "growth"
    ROTATION: Final = "rotation"
    #: v1.7: one of the dumps taken in a row while the process's memory grows.
    SAMPLING: Final = "sampling"


class AtPeakState:
    """``StackOk.stack_at_peak_state`` (v1.7)."""

    OK: Final = "ok"
    MISSED: Final = "missed"


class AlertKind:
    """``Alert.kind``."""

    HEADROOM: Final = "headroom"
    PRESSURE: Final = "pressure"
    LEAK: Final = "leak"
    BUDGET: Final = "budget"
    OOM_KILL: Final = "oom-kill"


class Resource:
    """``Headroom.resource`` (and a ``headroom`` alert's): the host, a GPU's UUID, or a
    memory cgroup with a limit (v1.7), ``cgroup:`` then its path as /proc/PID/cgroup
    shows it (``cgroup:/system.slice/docker-<ID>.scope``)."""

    HOST: Final = "host"
    CGROUP_PREFIX: Final = "cgroup:"


class AlertState:
    """``Alert.state``."""

    FIRING: Final = "firing"
    RESOLVED: Final = "resolved"


class Severity:
    """``Alert.severity``, most severe first in :data:`RANK`."""

    CRITICAL: Final = "critical"
    WARNING: Final = "warning"
    #: Sort key: lower is more severe.
    RANK: Final = {CRITICAL: 0, WARNING: 1}


class OomSource:
    """``Alert.source`` of an ``oom-kill`` alert: how the kill was known."""

    KERNEL_LOG: Final = "kernel-log"
    CGROUP: Final = "cgroup"
    INFERRED: Final = "inferred"


class ErrorCode:
    """``Error.code`` and ``Failure.code``."""

    NO_SUCH_PROCESS: Final = "no_such_process"
    PERMISSION_DENIED: Final = "permission_denied"
    INVALID: Final = "invalid"
    ERROR: Final = "error"
    INTERNAL: Final = "internal"
    UNKNOWN_REQUEST: Final = "unknown_request"
    PROTOCOL: Final = "protocol"
    VERSION: Final = "version"
    BUSY: Final = "busy"
    TOO_LARGE: Final = "too_large"
    #: A client neither subscribed nor sending requests was closed (v1.4).
    IDLE: Final = "idle"
