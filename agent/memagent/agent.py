"""The agent: the composition root. It builds the parts of each layer, wires them
together, and runs the tick and the serving loop on one asyncio loop.

A tick samples every live process (memory, then GPU), attaches new matching ones when a
scan is due, asks for stacks where memory moved, evaluates the alerts, and fans the
sample frame out to subscribers. What each step does lives in its layer
(``docs/architecture.md``); this module only decides the order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import time
from typing import TYPE_CHECKING

from memproto.records import Alert, StackDump
from memproto.text import printable
from memproto.vocabulary import AlertState, Severity

from .alerting.engine import AlertEngine
from .alerting.hooks import HookRunner
from .config import AgentConfig, AlertConfig, copy_live, split_changes
from .config.auto import resolve_users
from .core.autoattach import Scanner
from .core.containers import ContainerNames, apply_names
from .core.gpu import GpuSampler
from .core.groups import Groups
from .core.oom import OomScores
from .core.pacing import Pacer
from .core.process_events import ProcessEvents
from .core.registry import Registry
from .core.sampler import Sampler, Ticker
from .core.stack_collector import StackCollector
from .core.watched import Watched
from .errors import ConfigError
from .metrics.http import MetricsExporter
from .proc.nvmap import NVMAP_CLIENTS, NvmapSource
from .proc.nvml import Nvml
from .proc.procfs import ProcFS
from .serve.access import AccessPolicy, resolve_group
from .serve.dispatch import Dispatcher
from .serve.server import Server
from .serve.status import StatusReport
from .store.recorder import FlightRecorder
from .store.state import StateDir, StateKeeper

if TYPE_CHECKING:
    from .metrics.snapshot import MetricsSnapshotSource

log = logging.getLogger(__name__)


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
        """Every part built from its config and the parts it calls, in an order where each
        finds its collaborators built. Where a part calls one built after it (the registry
        announces to the server and the recorder; the stacks report to them), it is given
        a callback of the agent's that forwards to that part (see :class:`_Announcer`)."""
        if config.interval <= 0:
            raise ConfigError("interval", "must be positive")
        self.config = config
        self.procfs = procfs or ProcFS()
        #: The event loop :meth:`run` serves on (container names found in a thread wake it).
        self._loop: asyncio.AbstractEventLoop | None = None
        self.registry = Registry(
            self.procfs,
            history_step=max(config.history_step, config.interval),
            history_seconds=config.history_seconds,
            max_exited=config.max_exited,
            events=_Announcer(self),
            container_names=ContainerNames(config.containers_root or None, self._container_names_found),
            oom=OomScores(config.oom.scores, resolve_users(config.oom.trusted_users, "oom.trusted_users")),
        )
        self.groups = Groups(self.registry, config.max_rules_per_uid, config.max_rules)
        self.scanner = Scanner(self.registry, config.auto, label=config.auto_label, groups=self.groups,
                               cmdline=config.auto_cmdline, trusted_uids=resolve_users(config.auto_trusted_users),
                               wrappers=config.auto_wrappers)
        self.ticker = Ticker(config.interval, self.on_tick)
        self._scan_every = max(1, round(config.scan_interval / config.interval))
        self.stacks = StackCollector(config.stacks, on_state=self._stack_state, on_peak_stack=self._peak_stack)
        nvmap = None if config.nvmap_clients == "" else NvmapSource(config.nvmap_clients or NVMAP_CLIENTS)
        self.gpu = GpuSampler(self.registry, Nvml(), round(config.status_refresh / config.interval), nvmap)
        a = config.alerts
        self.hooks = HookRunner(a.hook, a.hook_timeout, user=a.hook_user, min_interval=a.hook_min_interval,
                                rate=a.hook_rate, burst=a.hook_burst)
        self.alerts = AlertEngine(self.registry, config.headroom, config.alerts, self.deliver_alert,
                                  self.stacks.peak_text)
        self.process_events = ProcessEvents(self.registry, self.scanner, on_sharing_change=self.alerts.sharing.touch)
        self.sampler = Sampler(self.registry, interval=config.interval, status_refresh=config.status_refresh,
                               before_exit=self.process_events.drain)
        self.dispatcher = Dispatcher(self.registry, self.stacks, lambda access: self.report.build(access),
                                     Pacer(self.ticker), self.groups)
        self.server = Server(
            config.socket,
            policy=AccessPolicy(resolve_group(config.admin_group, "admin_group"), self.procfs),
            handle_request=self.dispatcher.handle,
            interval=config.interval,
            socket_gid=resolve_group(config.socket_group, "socket_group"),
            max_clients=config.max_clients,
            max_clients_per_uid=config.max_clients_per_uid,
            idle_timeout=config.client_idle_timeout,
        )
        #: Hook runners replaced by a reload, finishing what they had started.
        self._retiring: set[asyncio.Task[None]] = set()
        #: The state kept across restarts (docs/service.md); ConfigError: a directory not to trust.
        self.state = StateDir(config.state_dir) if config.state_dir else None
        #: The flight recorder (docs/recording.md): off without a state directory.
        self.recorder = FlightRecorder(config.record, self.state, config.interval, registry=self.registry,
                                       stacks=self.stacks, alerts=self.alerts, procfs=self.procfs)
        self.report = StatusReport(config, time.time(), self.procfs, self.registry, self.ticker, self.server,
                                   self.gpu, self.stacks, self.alerts, self.process_events, self.recorder)
        #: The Prometheus endpoint and textfile (docs/metrics.md); each off unless configured.
        self.metrics = MetricsExporter(config.metrics, self._metrics_figures, self.ticker)

    def _metrics_figures(self) -> MetricsSnapshotSource:
        """What the exposition reads, built at its first scrape or textfile write (none in
        ``memagent run``: the module is not even imported there)."""
        from .metrics.snapshot import MetricsSnapshotSource

        return MetricsSnapshotSource(self.config, self.registry, self.alerts, self.ticker, self.stacks)

    def _container_names_found(self) -> None:
        """Told from the lookup thread (memagent.core.containers) that a name was found:
        the names are set on the loop, each entry announced again."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody to tell
                self._loop.call_soon_threadsafe(self._apply_container_names)

    def _apply_container_names(self) -> None:
        def announce(w: Watched) -> None:
            self.scanner.relabel(w)  # a label from its container's name: before it is announced
            self.registry.events.attached(w)

        apply_names(list(self.registry.entries.values()), self.registry.container_names, announce)

    def _stack_state(self, w: Watched, message: str | None) -> None:
        self.server.stack_state(w, message)
        self.recorder.stack_state(w, message)

    def _peak_stack(self, w: Watched, dump: StackDump) -> None:
        self.recorder.peak_stack(w, dump)

    def on_tick(self, now: float) -> None:
        if self.ticker.ticks % self._scan_every == 1 or self._scan_every == 1:
            self.scanner.scan()
        sampled = self.sampler.sample(now)
        self.registry.judge_oom()
        exited, changed = sampled.exited, sampled.changed
        if self.gpu.available:
            changed = changed + self.gpu.sample(self.ticker.ticks)
        if self.config.stacks.enabled:
            self.stacks.on_tick(now, changed, exited, self.registry)
        self.alerts.on_tick(now, exited, self.gpu.devices, changed=bool(changed or exited), moved=sampled.changed)
        rows, uids = self.registry.rows()
        self.server.broadcast_sample(self.ticker.ticks, now, rows, uids)
        self.recorder.sample(self.ticker.ticks, now, rows)

    def deliver_alert(self, alert: Alert) -> None:
        """Every way an alert leaves the daemon: log line, protocol frame, hook. The line's
        level is its syslog priority under journald (docs/service.md): a firing warning 4,
        a firing critical alert 3 (``journalctl -p err`` shows them), the rest 6."""
        level = logging.INFO
        if alert.state == AlertState.FIRING:
            level = logging.ERROR if alert.severity == Severity.CRITICAL else logging.WARNING
        log.log(level, "alert %s %s %s [%s]: %s", alert.kind, alert.state, alert.severity,
                printable(alert.resource), printable(alert.message))
        self.server.publish_alert(alert, self.registry)
        self.recorder.alert(alert)
        self.hooks.submit(alert)

    async def run(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        """Serve until ``stop`` is set; the socket file is removed on the way out."""
        raise_fd_limit()
        self._loop = asyncio.get_running_loop()
        self._apply_container_names()  # names found before the loop ran
        await self.metrics.start()  # bound before the socket: "listening on" means both are
        try:
            await self.server.start()
        except BaseException:
            await self.metrics.close()
            raise
        # Restored before any request is served (no await in between): the first `ls` sees it.
        keeper = None
        if self.state is not None:
            saved, rules, observed = self.state.load()
            self.alerts.take_back(observed)
            # Before the entries: a rule's processes started meanwhile get its label. Past
            # the caps (a file of an older version, or caps lowered): each user's first ones.
            dropped = self.groups.take_back(rules)
            if dropped:
                log.warning("restored from %s: %d group rules of users left out, past clients.max_rules_per_uid "
                            "(%d) or clients.max_rules (%d); root's and admin_group's all kept", self.state.path,
                            dropped, self.groups.max_per_uid, self.groups.max_rules)
            from .core.restore import restore  # only with a state directory (none in `memagent run`)

            back, gone = restore(self.registry, saved, time.time())
            if back or gone or rules:
                log.info("restored from %s: %d processes watched again, %d exited, %d group rules", self.state.path,
                         back, gone, self.groups.kept)
            keeper = self.report.state_keeper = StateKeeper(self.state, self.registry, self.groups,
                                                            self.alerts.together)
            if dropped:
                self.registry.edits += 1  # the file shrinks to what was kept
        await self.recorder.start()  # its first segment opens with what was restored
        recorder = asyncio.ensure_future(self.recorder.run())
        loop = asyncio.get_running_loop()
        # Listening before the first scan: a process is either found by it or heard of.
        event_fds = self.process_events.open(self.config.netlink)
        for fd in event_fds:
            loop.add_reader(fd, self.process_events.drain)
        self.gpu.start(self.config.gpu)
        patterns = [*self.config.auto, *self.config.auto_cmdline]
        log.info("sampling every %g s%s", self.config.interval,
                 f", auto-attaching {', '.join(map(printable, patterns))}" if patterns else "")
        if patterns:
            self.scanner.scan()
        ticker = asyncio.ensure_future(self.ticker.run())
        dumper = asyncio.ensure_future(self.stacks.run())
        saver = asyncio.ensure_future(keeper.run() if keeper is not None else stop.wait())
        textfile = asyncio.ensure_future(self.metrics.run_textfile())
        if ready is not None:
            ready.set()
        try:
            await stop.wait()
        finally:
            for task in (ticker, dumper, saver, textfile):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self.recorder.stop()  # not cancelled: it writes its last batch and syncs its segment
            await recorder
            self.registry.oom.release_all(self.registry.alive)  # before the save: nothing left to give back
            if keeper is not None:
                keeper.save()  # after a write in flight; then its thread ends
                keeper.close()
            for fd in event_fds:
                loop.remove_reader(fd)
            self.process_events.close()
            await self.metrics.close()
            await self.server.close()
            for task in self._retiring:
                task.cancel()
            await asyncio.gather(*self._retiring, return_exceptions=True)
            await self.hooks.close()
            self.alerts.close()
            self.registry.close()
            self.registry.container_names.close()
            self.gpu.close()
            if self.state is not None:
                self.state.close()
            log.info("stopped")

    # ------------------------------------------------------------------ the service (docs/service.md)

    def on_time(self, slack: float) -> bool:
        """Whether the tick loop keeps its deadlines: running, its next tick overdue by no
        more than ``slack`` seconds. The watchdog pings only then."""
        return self.ticker.deadline is not None and self.ticker.due_in() > -slack

    def summary(self) -> str:
        """One line for ``systemctl status``."""
        return (f"{len(self.registry.alive)} processes watched, {len(self.server.sessions)} clients, "
                f"sampling every {self.config.interval:g} s")

    def reload(self, new: AgentConfig) -> tuple[list[str], list[str]]:
        """Apply a configuration read again (SIGHUP) to the running parts: what is watched,
        its peaks, history, labels, alerts and clients stay. Returns the file keys applied
        and those kept at their running value until a restart (each key's declared
        ``reload``, memagent.config.sections). Each part applies its own live keys; a
        restart key is never applied. What can fail (a group or hook user gone) is done
        first: on ConfigError nothing changed."""
        applied, kept = split_changes(self.config, new)
        if not applied:
            return applied, kept
        policy = AccessPolicy(resolve_group(new.admin_group, "admin_group"), self.procfs)
        trusted_uids = resolve_users(new.auto_trusted_users)
        oom_uids = resolve_users(new.oom.trusted_users, "oom.trusted_users")
        hooks = None
        if _hook_settings(new.alerts) != _hook_settings(self.config.alerts):
            a = new.alerts
            hooks = HookRunner(a.hook, a.hook_timeout, user=a.hook_user, min_interval=a.hook_min_interval,
                               rate=a.hook_rate, burst=a.hook_burst)
        c = self.config
        copy_live(c, new)  # the top-level keys, in place: the status report holds this object
        self.sampler.status_every = self.gpu.exact_every = max(1, round(c.status_refresh / c.interval))
        if {"auto", "auto_cmdline", "auto_label", "auto_wrappers"} & set(applied):  # a new scanner looks again
            self.scanner = self.process_events.scanner = Scanner(
                self.registry, c.auto, label=c.auto_label, groups=self.groups, cmdline=c.auto_cmdline,
                trusted_uids=trusted_uids, given=self.scanner.given, wrappers=c.auto_wrappers)
        elif "auto_trusted_users" in applied:
            self.scanner.retrust(trusted_uids)
        self.groups.max_per_uid, self.groups.max_rules = c.max_rules_per_uid, c.max_rules  # kept ones stay
        self.stacks.apply(new.stacks)
        self.alerts.apply(new.headroom, new.alerts)
        self.recorder.apply(new.record)
        self.metrics.apply(new.metrics)
        copy_live(c.oom, new.oom)
        if {"oom_score_adj", "oom.trusted_users"} & set(applied):
            self.registry.oom.apply(c.oom.scores, oom_uids)  # judged again at the next tick
        self.server.apply(policy, max_clients=c.max_clients, max_clients_per_uid=c.max_clients_per_uid,
                          idle_timeout=c.client_idle_timeout)
        if hooks is not None:
            old, self.hooks = self.hooks, hooks
            task = asyncio.ensure_future(_retire(old))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        return applied, kept


class _Announcer:
    """The registry's events (attached, exited, detached), to the server and then the
    recorder. The registry is built before either of them (both read it), so it is given
    this, which reaches them through the agent when an event comes, after construction."""

    __slots__ = ("agent",)

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def attached(self, w: Watched) -> None:
        self.agent.server.attached(w)
        self.agent.recorder.attached(w)

    def exited(self, w: Watched) -> None:
        self.agent.server.exited(w)
        self.agent.recorder.exited(w)

    def detached(self, w: Watched) -> None:
        self.agent.server.detached(w)
        self.agent.recorder.detached(w)


def _hook_settings(a: AlertConfig) -> tuple[object, ...]:
    return tuple(a.hook), a.hook_timeout, a.hook_user, a.hook_min_interval, a.hook_rate, a.hook_burst


async def _retire(runner: HookRunner) -> None:
    """A hook runner a reload replaced: the hooks it runs or holds still run, then it closes
    (at shutdown: closed at once, as the current one is)."""
    try:
        await runner.drained()
    finally:
        await runner.close()
