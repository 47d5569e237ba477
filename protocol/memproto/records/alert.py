"""Alerts, as the hook, ``status`` and memtop get them."""

from __future__ import annotations

from dataclasses import dataclass

from ..schema import wire
from .headroom import Contributor


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
