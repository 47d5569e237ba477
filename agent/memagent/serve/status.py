"""The daemon's status as one client may see it: its own health, the host, the GPUs,
the headroom and the alerts, with other users' processes left out for a client that
does not see everything (see :mod:`memagent.serve.access`).

Built on request (``memagent status``, memtop every 2 s), never per tick: it reads
/proc/meminfo once and walks the registry once for the client's own PIDs. A /proc/meminfo
that cannot be read gives the last good reading and a line in ``faults``
(:meth:`~memagent.proc.procfs.ProcFS.meminfo`): the status still answers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from memproto.records import Alert, DaemonStatus, GpuInfo

from .. import SOFTWARE
from ..alerting.engine import AlertEngine
from ..alerting.headroom import host_memory
from ..config import AgentConfig
from ..core.gpu import GpuSampler
from ..core.process_events import ProcessEvents
from ..core.registry import Registry
from ..core.sampler import Ticker
from ..core.stack_collector import StackCollector
from ..proc.procfs import ProcFS
from ..store.recorder import FlightRecorder
from ..store.state import StateKeeper
from .access import Access, alert_for, headroom_for, own_pids
from .server import Server


@dataclass
class StatusReport:
    """The parts the status is read from; :meth:`build` reads them for one client."""

    config: AgentConfig
    started_at: float
    procfs: ProcFS
    registry: Registry
    ticker: Ticker
    server: Server
    gpu: GpuSampler
    stacks: StackCollector
    alerts: AlertEngine
    events: ProcessEvents
    #: The flight recorder; None: none (a part built without one, in tests).
    recorder: FlightRecorder | None = None
    #: What saves the state directory (set once it runs); its failure is a fault.
    state_keeper: StateKeeper | None = None

    def build(self, access: Access) -> DaemonStatus:
        visible = self.registry.visible(access.may_watch)
        own = own_pids(access, self.registry)
        host = host_memory(self.procfs.meminfo())
        stacks, rec = self.config.stacks, self.recorder
        oom_adjusted, oom_refused = self.registry.oom.counts(visible)
        return DaemonStatus(
            software=SOFTWARE,
            pid=os.getpid(),
            uid=os.getuid(),
            started_at=self.started_at,
            interval=self.config.interval,
            socket=self.config.socket,
            watched=len(visible),
            watched_total=len(self.registry.entries),
            oom_adjusted=oom_adjusted,
            oom_refused=oom_refused,
            alive=sum(1 for w in visible if w.alive),
            clients=len(self.server.sessions),
            tick=self.ticker.stats(),
            host=host,
            dropped_samples=self.server.dropped_samples,
            gpu_available=self.gpu.available,
            gpus=[GpuInfo(d.index, d.name, d.uuid, d.total, d.used, d.lost) for d in self.gpu.devices],
            gpu_note=self.gpu.nvml.note,
            host_pid_namespace=self.gpu.host_pid_namespace,
            stack_dumps=self.stacks.dumps_started,
            stack_budget=stacks.budget if self.stacks.usable else 0.0,
            stack_note=None if self.stacks.usable else ("disabled (--no-stacks)" if not stacks.enabled
                                                         else "py-spy not found"),
            headroom=[headroom_for(h, own) for h in self.alerts.headroom],
            alerts_active=_visible(self.alerts.book.active.values(), own),
            alerts_recent=_visible(self.alerts.book.recent, own),
            pressure=self.alerts.pressure,
            process_events=self.events.mode,
            process_events_note=self.events.note if self.events.overruns == 0 else
            f"{self.events.overruns} socket overruns: events lost (the /proc scan covers missed forks)",
            faults=self.procfs.faults + self.alerts.limits.faults + self._state_faults(),
            # Where the recorder writes: only to a client that sees all.
            recording=rec.state if rec else "off",
            recording_dir=rec.path if rec and access.sees_all else None,
            recording_bytes=rec.total_bytes if rec else 0,
            recording_note=rec.note(access.sees_all) if rec else None,
            gpu_source=self.gpu.source,
            gpu_source_note=self.gpu.source_note,
            stack_sampler=self.stacks.sampler,
            stack_sampler_note=self.stacks.sampler_note,
            sampler_bursts=self.stacks.bursts.started,
            stack_cpu_budget=self.stacks.budget.share if self.stacks.usable else 0.0,
            stack_cpu_rate=self.stacks.budget.rate,
            stack_cpu_window=self.stacks.budget.window,
            stack_cpu_own_seconds=self.stacks.budget.own_seconds,
            stack_cpu_helper_seconds=self.stacks.budget.helper_seconds,
        )

    def _state_faults(self) -> list[str]:
        keeper = self.state_keeper
        return [keeper.fault] if keeper is not None and keeper.fault is not None else []


def _visible(alerts: Iterable[Alert], own: set[int] | None) -> list[Alert]:
    seen = (alert_for(a, own) for a in alerts)
    return [a for a in seen if a is not None]
