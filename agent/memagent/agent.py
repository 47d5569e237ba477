"""The agent: registry + sampler + auto-attach + server, driven by one ticker.

Everything runs on one asyncio loop. A tick samples every live process, attaches new
matching ones when a scan is due, and fans the sample frame out to subscribers; the
sampler's cost is measured per tick and exposed in ``status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from memproto.records import Alert, DaemonStatus, GpuInfo, GpuUse, HostMemory

from . import SOFTWARE
from .auth import Access, AccessPolicy, resolve_group
from .autoattach import Scanner
from .config import AlertConfig, HeadroomConfig
from .dispatch import Dispatcher
from .gpu import DeviceReading, Nvml, in_host_pid_namespace, pids_unmatched
from .hooks import HookRunner
from .procfs import ProcFS
from .registry import Registry
from .sampler import Sampler, Ticker
from .server import Server
from .stack_collector import StackCollector
from .stacks import StackConfig
from .watch import Watched
from .watchdog import AlertEngine

log = logging.getLogger(__name__)


@dataclass
class AgentConfig:
    socket: str
    interval: float = 0.5
    auto: list[str] = field(default_factory=list)
    #: Label given to auto-attached processes.
    auto_label: str | None = None
    #: Members of this group see and change every watched process, as root does.
    admin_group: str | None = None
    #: The socket file's group: its members may connect.
    socket_group: str | None = None
    history_seconds: float = 600.0
    history_step: float = 1.0
    #: Longest time between two reads of a process's VmHWM and swap (when statm is unchanged).
    status_refresh: float = 1.0
    scan_interval: float = 1.0
    max_exited: int = 256
    max_clients: int = 64
    #: Read GPU memory through NVML (when a driver is there).
    gpu: bool = True
    stacks: StackConfig = field(default_factory=StackConfig)
    headroom: HeadroomConfig = field(default_factory=HeadroomConfig)
    alerts: AlertConfig = field(default_factory=AlertConfig)


def raise_fd_limit() -> int:
    """Each watched process holds 3 descriptors: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return hard
    return soft


class Agent:
    def __init__(self, config: AgentConfig, procfs: ProcFS | None = None) -> None:
        if config.interval <= 0:
            raise ValueError("interval must be positive")
        self.config = config
        self.procfs = procfs or ProcFS()
        self.started_at = time.time()
        self.registry = Registry(
            self.procfs,
            history_step=max(config.history_step, config.interval),
            history_seconds=config.history_seconds,
            max_exited=config.max_exited,
        )
        self.sampler = Sampler(self.registry, interval=config.interval, status_refresh=config.status_refresh)
        self.scanner = Scanner(self.registry, config.auto, label=config.auto_label)
        self.dispatcher = Dispatcher(self)
        self.server = Server(
            config.socket,
            policy=AccessPolicy(resolve_group(config.admin_group), self.procfs),
            handle_request=self.dispatcher.handle,
            interval=config.interval,
            socket_gid=resolve_group(config.socket_group),
            max_clients=config.max_clients,
        )
        self.registry.events = self.server
        self.ticker = Ticker(config.interval, self.on_tick)
        self._scan_every = max(1, round(config.scan_interval / config.interval))
        self.stacks = StackCollector(config.stacks, on_state=self.server.stack_state)
        self.hooks = HookRunner(config.alerts.hook, config.alerts.hook_timeout)
        self.alerts = AlertEngine(self.registry, config.headroom, config.alerts, self.deliver_alert, self.stack_text)
        self.gpu = Nvml()
        self.gpu_devices: list[DeviceReading] = []
        self.host_pid_namespace = in_host_pid_namespace()
        #: Ticks between forced reads of the driver's per-process peak (as for VmHWM).
        self._exact_every = max(1, round(config.status_refresh / config.interval))

    def on_tick(self, now: float) -> None:
        if self.ticker.ticks % self._scan_every == 1 or self._scan_every == 1:
            self.scanner.scan()
        exited = self.sampler.sample(now)
        changed = self.sampler.changed
        if self.gpu.available:
            changed = changed + self.sample_gpu()
        if self.config.stacks.enabled:
            self.stacks.on_tick(now, changed, exited, self.registry)
        self.alerts.on_tick(now, exited, self.gpu_devices, changed=bool(changed or exited))
        rows, uids = self.sampler.rows()
        self.server.broadcast_sample(self.ticker.ticks, now, rows, uids)

    def deliver_alert(self, alert: Alert) -> None:
        """Every way an alert leaves the daemon: log line, protocol frame, hook."""
        level = logging.WARNING if alert.state == "firing" else logging.INFO
        log.log(level, "alert %s %s %s [%s]: %s", alert.kind, alert.state, alert.severity, alert.resource,
                alert.message)
        self.server.publish_alert(alert, self.registry)
        self.hooks.submit(alert)

    def _visible_alerts(self, alerts: Iterable[Alert], own: set[int] | None) -> list[Alert]:
        seen = (self.server.alert_for(a, own) for a in alerts)
        return [a for a in seen if a is not None]

    def stack_text(self, w: Watched) -> str | None:
        """The stack closest to the peak, as text (for an oom-kill alert)."""
        ps = self.stacks.stacks.get(w.key)
        dump = (ps.at_peak or ps.latest) if ps else None
        if dump is None:
            return None
        thread = next((t for t in dump.threads if t.thread_id == dump.attributed_thread), None)
        frames = thread.frames if thread else []
        return "stack at peak: " + " <- ".join(f"{f.name} ({f.filename}:{f.line})" for f in frames[:8])

    def sample_gpu(self) -> list[Watched]:
        """One NVML read per device, then each watched process's share of it; returns the
        processes whose GPU memory changed."""
        reading = self.gpu.read()
        self.gpu_devices = reading.devices
        if self.host_pid_namespace and pids_unmatched(reading.usage):
            self.host_pid_namespace = False
            log.warning("none of the PIDs NVML reports exists here: this agent is not in the host PID "
                        "namespace, so per-process GPU memory cannot be matched (run it with the host's PID "
                        "namespace, e.g. docker --pid=host)")
        uuid = {d.index: d.uuid for d in reading.devices}
        accounting = {d.index for d in reading.devices if d.accounting and not d.lost}
        due = self.ticker.ticks % self._exact_every == 0
        changed = []
        for w in self.registry.alive:
            uses = list(reading.usage.get(w.pid, ()))
            before = {g.index: g.used_bytes for g in w.vram_gpus}
            # A GPU whose list failed this tick: what was there is unknown now, not gone.
            uses += [(index, None) for index in reading.failed if index in before]
            exact: dict[int, int] = {}
            for index, used in uses:
                if index in accounting and (due or before.get(index, -1) != used):
                    peak = self.gpu.accounting_max(index, w.pid)
                    if peak is not None:
                        exact[index] = peak
            vram, peak = w.vram, w.vram_peak
            w.set_vram([GpuUse(i, uuid[i], used) for i, used in uses], exact)
            if (w.vram, w.vram_peak) != (vram, peak):
                changed.append(w)
        return changed

    def status(self, access: Access) -> DaemonStatus:
        visible = self.registry.visible(access.may_watch)
        own = self.server.own_pids(access, self.registry)
        mem = self.procfs.meminfo()
        host = HostMemory(
            total_bytes=mem.get("MemTotal", 0),
            available_bytes=mem.get("MemAvailable", mem.get("MemFree", 0)),
            swap_total_bytes=mem.get("SwapTotal", 0),
            swap_free_bytes=mem.get("SwapFree", 0),
        )
        return DaemonStatus(
            software=SOFTWARE,
            pid=os.getpid(),
            uid=os.getuid(),
            started_at=self.started_at,
            interval=self.config.interval,
            socket=self.config.socket,
            watched=len(visible),
            alive=sum(1 for w in visible if w.alive),
            clients=len(self.server.sessions),
            tick=self.ticker.stats(),
            host=host,
            dropped_samples=self.server.dropped_samples,
            gpu_available=self.gpu.available,
            gpus=[GpuInfo(d.index, d.name, d.uuid, d.total, d.used, d.lost) for d in self.gpu_devices],
            gpu_note=self.gpu.note,
            host_pid_namespace=self.host_pid_namespace,
            stack_dumps=self.stacks.dumps_started,
            stack_budget=self.config.stacks.budget if self.stacks.usable else 0.0,
            stack_note=None if self.stacks.usable else ("disabled (--no-stacks)" if not self.config.stacks.enabled
                                                         else "py-spy not found"),
            headroom=[self.server.headroom_for(h, own) for h in self.alerts.headroom],
            alerts_active=self._visible_alerts(self.alerts.book.active.values(), own),
            alerts_recent=self._visible_alerts(self.alerts.book.recent, own),
            pressure=self.alerts.pressure,
        )

    async def run(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        """Serve until ``stop`` is set; the socket file is removed on the way out."""
        raise_fd_limit()
        await self.server.start()
        if self.config.gpu:
            self.gpu.start()
            if self.gpu.available:
                self.gpu_devices = self.gpu.read().devices
                if not self.host_pid_namespace:
                    log.warning("this agent runs in a nested PID namespace but NVML reports host PIDs: "
                                "per-process GPU memory will not match; run it in the host PID namespace "
                                "(e.g. docker --pid=host)")
        else:
            self.gpu.note = "disabled (--no-gpu)"
        log.info("sampling every %g s%s", self.config.interval,
                 f", auto-attaching {', '.join(self.config.auto)}" if self.config.auto else "")
        if self.config.auto:
            self.scanner.scan()
        ticker = asyncio.ensure_future(self.ticker.run())
        dumper = asyncio.ensure_future(self.stacks.run())
        if ready is not None:
            ready.set()
        try:
            await stop.wait()
        finally:
            ticker.cancel()
            dumper.cancel()
            for task in (ticker, dumper):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.server.close()
            await self.hooks.close()
            self.alerts.close()
            self.registry.close()
            self.gpu.close()
            log.info("stopped")
