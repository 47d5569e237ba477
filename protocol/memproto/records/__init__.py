"""The records that frames carry: processes, GPUs, headroom, alerts, stacks, and the
sample row. ``docs/protocol.md`` is their prose twin; :mod:`memproto.frames` wraps them
into frames.

Units: memory in bytes, times in Unix seconds (float), intervals in seconds. A process is
identified by ``(pid, start_time)``: a PID the kernel reuses belongs to a new process.

Each topic is a module of its own, imported at the first use of one of its names (see
:mod:`memproto._lazy`): ``from memproto.records import ProcessInfo`` loads
:mod:`memproto.records.process` alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .alert import Alert as Alert
    from .headroom import (
        Contributor as Contributor,
    )
    from .headroom import (
        Headroom as Headroom,
    )
    from .history import Series as Series
    from .process import (
        Container as Container,
    )
    from .process import (
        Failure as Failure,
    )
    from .process import (
        GpuUse as GpuUse,
    )
    from .process import (
        ProcessInfo as ProcessInfo,
    )
    from .process import (
        ProcessRef as ProcessRef,
    )
    from .sample import (
        OPTIONAL_SAMPLE_FIELDS as OPTIONAL_SAMPLE_FIELDS,
    )
    from .sample import (
        SAMPLE_CHECKS as SAMPLE_CHECKS,
    )
    from .sample import (
        SAMPLE_COLUMNS as SAMPLE_COLUMNS,
    )
    from .sample import (
        SAMPLE_EXACT as SAMPLE_EXACT,
    )
    from .sample import (
        SAMPLE_FIELDS as SAMPLE_FIELDS,
    )
    from .sample import (
        ProcessSample as ProcessSample,
    )
    from .stacks import (
        GrowthSite as GrowthSite,
    )
    from .stacks import (
        StackDump as StackDump,
    )
    from .stacks import (
        StackFrame as StackFrame,
    )
    from .stacks import (
        ThreadStack as ThreadStack,
    )
    from .status import (
        DaemonStatus as DaemonStatus,
    )
    from .status import (
        GpuInfo as GpuInfo,
    )
    from .status import (
        HostMemory as HostMemory,
    )
    from .status import (
        TickStats as TickStats,
    )

#: Where each name is declared: its module's full name.
_HOMES: dict[str, str] = {
    "GpuUse": f"{__name__}.process",
    "Container": f"{__name__}.process",
    "ProcessInfo": f"{__name__}.process",
    "Failure": f"{__name__}.process",
    "ProcessRef": f"{__name__}.process",
    "Series": f"{__name__}.history",
    "Contributor": f"{__name__}.headroom",
    "Headroom": f"{__name__}.headroom",
    "Alert": f"{__name__}.alert",
    "TickStats": f"{__name__}.status",
    "HostMemory": f"{__name__}.status",
    "GpuInfo": f"{__name__}.status",
    "DaemonStatus": f"{__name__}.status",
    "StackFrame": f"{__name__}.stacks",
    "ThreadStack": f"{__name__}.stacks",
    "StackDump": f"{__name__}.stacks",
    "GrowthSite": f"{__name__}.stacks",
    "SAMPLE_FIELDS": f"{__name__}.sample",
    "OPTIONAL_SAMPLE_FIELDS": f"{__name__}.sample",
    "SAMPLE_COLUMNS": f"{__name__}.sample",
    "SAMPLE_CHECKS": f"{__name__}.sample",
    "SAMPLE_EXACT": f"{__name__}.sample",
    "ProcessSample": f"{__name__}.sample",
}
__getattr__, __dir__ = lazy_names(__name__, _HOMES)
