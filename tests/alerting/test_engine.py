"""The alert engine (:class:`AlertEngine`) driven tick by tick over a fixture /proc tree,
with the real sampler, registry, alert book and PSS reads on a real event loop."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from proctree import TRAINER, GiB, MiB, ProcTree

from memagent.alerting.engine import LEAK_EVERY, PSS_GRACE, AlertEngine
from memagent.config import AlertConfig, HeadroomConfig
from memagent.core.registry import Registry
from memagent.core.sampler import Sampler
from memagent.proc.kmsg import KernelLog, Victim, parse_victim
from memagent.proc.nvml import DeviceReading
from memproto.records import Alert, Contributor

NO_GPUS: list[DeviceReading] = []


class Box:
    """A registry, the sampler and the engine over the tree, ticked as the agent ticks them."""

    def __init__(self, tree: ProcTree, registry: Registry, kmsg_path: Path, capacity: int,
                 budgets: dict[str, int] | None = None) -> None:
        self.tree = tree
        self.registry = registry
        self.delivered: list[Alert] = []
        self.kmsg_path = kmsg_path
        kmsg_path.write_bytes(b"")
        self.sampler = Sampler(registry, interval=0.5)
        self.engine = AlertEngine(registry, HeadroomConfig(host_capacity=capacity),
                                  AlertConfig(budgets=budgets or {}), self.delivered.append, lambda w: None,
                                  kmsg=KernelLog(str(kmsg_path)))

    def start(self, pid: int, rss: int, label: str | None = None, now: float = 1000.0, pss: bool = True) -> None:
        """A process of ``rss`` bytes (none of it shared, when its smaps_rollup is readable), attached."""
        if pid != TRAINER:
            self.tree.add_process(pid, f"worker-{pid}")
        self.tree.set_memory(pid, rss, hwm=rss)
        if pss:
            self.tree.set_smaps_rollup(pid, rss, rss)
        self.registry.attach(pid, label=label, now=now)

    def resize(self, pid: int, rss: int, now: float) -> None:
        """Memory of ``pid`` now ``rss``, and a new peak window (reset-peaks) from there."""
        self.tree.set_memory(pid, rss, hwm=rss)
        self.registry.reset_peaks(pid, now=now)

    async def tick(self, now: float) -> None:
        sampled = self.sampler.sample(now)
        self.engine.on_tick(now, sampled.exited, NO_GPUS, changed=bool(sampled.changed or sampled.exited))
        await self.engine.pss_settled()  # the PSS reads it started in a worker thread

    def fired(self, kind: str) -> list[Alert]:
        return [a for a in self.delivered if a.kind == kind]


@pytest.fixture
def box(proc_tree: ProcTree, registry: Registry, tmp_path: Path) -> Iterator[Box]:
    b = Box(proc_tree, registry, tmp_path / "kmsg", capacity=1000 * MiB)
    yield b
    b.engine.close()


async def test_a_headroom_alert_fires_and_resolves_with_hysteresis(box: Box) -> None:
    box.start(TRAINER, 500 * MiB)
    await box.tick(1000.0)
    box.tree.set_memory(TRAINER, 920 * MiB)
    await box.tick(1000.5)
    (fired,) = box.delivered
    assert (fired.kind, fired.resource, fired.state, fired.severity) == ("headroom", "host", "firing", "warning")
    assert fired.value == pytest.approx(0.92) and fired.unit == "ratio"
    assert fired.contributors == [Contributor(TRAINER, "-m train", 920 * MiB)]
    box.resize(TRAINER, 880 * MiB, now=1001.0)  # below 0.9, not below 0.9 * (1 - 0.05)
    await box.tick(1001.0)
    assert box.delivered == [fired]
    assert box.engine.headroom[0].ratio == pytest.approx(0.88)
    assert [a.value for a in box.engine.book.active.values()] == [pytest.approx(0.88)]
    box.resize(TRAINER, 800 * MiB, now=1001.5)
    await box.tick(1001.5)
    resolved = box.delivered[-1]
    assert (resolved.state, resolved.id, len(box.delivered)) == ("resolved", fired.id, 2)
    assert not box.engine.book.active


async def test_the_host_is_not_judged_before_a_new_process_pss_is_read(box: Box) -> None:
    """Just attached, a process counts its shared pages in full: no verdict until its PSS is read."""
    box.start(TRAINER, 950 * MiB)
    await box.tick(1000.0)
    assert box.engine.headroom[0].ratio == pytest.approx(0.95)
    assert box.delivered == []
    assert box.registry.alive[0].share_known  # read meanwhile (the tick waited for it)
    await box.tick(1000.5)
    assert [(a.kind, a.state) for a in box.delivered] == [("headroom", "firing")]


async def test_the_pss_grace_ends(box: Box) -> None:
    """A process whose PSS cannot be read is judged anyway once PSS_GRACE is over."""
    box.start(TRAINER, 950 * MiB, pss=False)
    for now in (1000.0, 1001.0, 1000.0 + PSS_GRACE - 1):  # a full evaluation each second
        await box.tick(now)
    assert box.delivered == [] and not box.registry.alive[0].share_known
    await box.tick(1000.0 + PSS_GRACE)
    assert [(a.kind, a.state) for a in box.delivered] == [("headroom", "firing")]


async def test_a_budget_alert_per_label(proc_tree: ProcTree, registry: Registry, tmp_path: Path) -> None:
    box = Box(proc_tree, registry, tmp_path / "kmsg", capacity=100_000 * MiB,
              budgets={"bert": 1000 * MiB, "gpt": 2000 * MiB})
    try:
        box.start(TRAINER, 600 * MiB, label="bert")
        box.start(5001, 500 * MiB, label="bert")
        box.start(5002, 900 * MiB, label="gpt")
        box.start(5003, 3000 * MiB)  # no label: in no budget
        await box.tick(1000.0)
        (alert,) = box.delivered
        assert (alert.kind, alert.resource, alert.state, alert.severity) == ("budget", "bert", "firing", "warning")
        assert alert.value == pytest.approx(1.1)
        assert alert.contributors == [Contributor(TRAINER, "bert", 600 * MiB), Contributor(5001, "bert", 500 * MiB)]
        box.registry.detach(5001)
        await box.tick(1000.5)
        assert [(a.resource, a.state) for a in box.delivered] == [("bert", "firing"), ("bert", "resolved")]
    finally:
        box.engine.close()


@pytest.mark.parametrize(("signal", "rss", "pressure", "source"), [
    (9, 950 * MiB, None, "inferred"),  # SIGKILL with the headroom near full
    (9, 300 * MiB, 25.0, "inferred"),  # SIGKILL under memory pressure
    (9, 300 * MiB, None, None),  # a plain kill -9 on a relaxed box
    (15, 950 * MiB, None, None),  # SIGTERM is never the OOM killer
    (0, 950 * MiB, None, None),  # it exited
], ids=["sigkill-headroom-full", "sigkill-pressure", "sigkill-relaxed", "sigterm", "exit"])
async def test_an_oom_kill_is_inferred_from_a_sigkill_at_high_memory(
    box: Box, signal: int, rss: int, pressure: float | None, source: str | None
) -> None:
    if pressure is not None:
        box.tree.set_pressure(pressure)
    box.start(TRAINER, rss)
    await box.tick(1000.0)
    await box.tick(1000.5)
    box.tree.exit(TRAINER, signal)
    await box.tick(1001.0)
    assert not box.registry.entries[(TRAINER, 51234)].alive
    oom = box.fired("oom-kill")
    if source is None:
        assert oom == []
        return
    (alert,) = oom
    assert (alert.pid, alert.resource, alert.state, alert.severity, alert.source) == (
        TRAINER, f"pid:{TRAINER}", "firing", "critical", source)
    assert alert.value == rss and alert.contributors == [Contributor(TRAINER, "-m train", rss)]
    assert "killed by the OOM killer (inferred: SIGKILL at high memory)" in alert.message
    assert alert.details is not None and alert.details.startswith("last RSS per second: ")
    assert alert in box.engine.book.recent and not any(a.kind == "oom-kill" for a in box.engine.book.active.values())


async def test_an_oom_kill_in_the_kernel_log_needs_no_inference(box: Box) -> None:
    box.start(TRAINER, 300 * MiB)  # a relaxed box: no inference would blame the OOM killer
    await box.tick(1000.0)
    with box.kmsg_path.open("ab") as kmsg:
        kmsg.write(b"3,1234,5678,-;Out of memory: Killed process 4242 (python3) total-vm:1204936kB\n")
    box.tree.exit(TRAINER, 9)
    await box.tick(1000.5)
    (alert,) = box.fired("oom-kill")
    assert (alert.pid, alert.source) == (TRAINER, "kernel-log")
    assert "inferred" not in alert.message


#: The kernel's line for a victim (4.19 on): its RSS by kind and its oom_score_adj.
VICTIM_LINE = (b"3,1240,5690,-;Memory cgroup out of memory: Killed process 5001 (python3) total-vm:900000kB, "
               b"anon-rss:204800kB, file-rss:4096kB, shmem-rss:0kB, UID:0 pgtables:800kB oom_score_adj:800\n")


def test_the_kernels_victim_line_gives_its_rss_and_oom_score_adj() -> None:
    victim = parse_victim(VICTIM_LINE)
    assert victim == Victim(5001, (204800 + 4096) * 1024, 800)
    assert parse_victim(b"3,1,2,-;Out of memory: Killed process 4242 (python3) total-vm:1204936kB\n") is None


async def test_an_oom_kill_says_the_victim_had_the_highest_score_and_names_the_model_it_spared(box: Box) -> None:
    """The table's case (docs/oom.md): the smaller "trainer" (800) killed, the larger
    "detector" (-800, read from its /proc file) spared: said in the alert and its fields."""
    box.tree.set_status(TRAINER, VmSwap=0)
    box.start(TRAINER, 300 * MiB, label="detector")
    box.start(5001, 200 * MiB, label="trainer")
    box.tree.write(TRAINER, "oom_score_adj", "-800\n")
    await box.tick(1000.0)
    with box.kmsg_path.open("ab") as kmsg:
        kmsg.write(VICTIM_LINE)
    box.tree.exit(5001, 9)
    await box.tick(1000.5)
    (alert,) = box.fired("oom-kill")
    assert alert.oom_highest is True
    assert alert.spared == Contributor(TRAINER, "detector", 300 * MiB)
    assert "it had the highest OOM score of the 2 watched processes in the host" in alert.message
    assert f"spared detector ({TRAINER}), the largest there at 300 MiB, oom_score_adj -800" in alert.message


async def test_without_a_known_score_the_alert_says_nothing_of_it(box: Box) -> None:
    """No kernel line and no value the daemon set: the victim's score is not known, so no
    claim of "highest" (missing, not wrong); the larger survivor is still named."""
    box.start(TRAINER, 300 * MiB, label="detector")
    box.start(5001, 200 * MiB, label="trainer")
    await box.tick(1000.0)
    with box.kmsg_path.open("ab") as kmsg:
        kmsg.write(b"3,1234,5678,-;Out of memory: Killed process 5001 (python3) total-vm:1204936kB\n")
    box.tree.exit(5001, 9)
    await box.tick(1000.5)
    (alert,) = box.fired("oom-kill")
    assert alert.oom_highest is None and "highest OOM score" not in alert.message
    assert alert.spared is not None and alert.spared.pid == TRAINER


async def test_memory_pressure_raises_a_pressure_alert(box: Box) -> None:
    box.tree.set_pressure(12.5)
    box.start(TRAINER, 100 * MiB)
    await box.tick(1000.0)
    (alert,) = box.delivered
    assert (alert.kind, alert.resource, alert.severity, alert.unit) == ("pressure", "host", "warning", "percent")
    assert alert.value == 12.5 and box.engine.pressure == 12.5


async def test_a_resolved_alert_lists_the_contributors_of_when_it_resolved(box: Box) -> None:
    """A process detached while the alert fired is no longer among its contributors."""
    box.start(TRAINER, 500 * MiB)
    box.start(5001, 450 * MiB)
    await box.tick(1000.0)  # (their PSS is read: judged from the next tick on)
    await box.tick(1000.5)
    (fired,) = box.delivered
    assert [c.pid for c in fired.contributors] == [TRAINER, 5001]
    box.registry.detach(5001)
    await box.tick(1001.0)
    resolved = box.delivered[-1]
    assert (resolved.state, resolved.id) == ("resolved", fired.id)
    assert resolved.contributors == [Contributor(TRAINER, "-m train", 500 * MiB)]
    assert resolved.value == pytest.approx(0.5)


# --------------------------------------------------------------------------- leaks

Shape = Callable[[float], int]


async def run_leak(proc_tree: ProcTree, registry: Registry, tmp_path: Path, rss: Shape, seconds: float,
                   capacity: int = 24 * GiB, step: float = 1.0) -> list[tuple[float, Alert]]:
    """One process whose RSS follows ``rss(t)`` (t: seconds since attach), ticked every
    ``step`` for ``seconds`` on a box of ``capacity`` with the default [alerts] (leak_horizon
    24 h); every leak alert delivered, with its t."""
    box = Box(proc_tree, registry, tmp_path / "kmsg", capacity=capacity)
    t0 = 10_000.0
    leaks: list[tuple[float, Alert]] = []
    try:
        box.start(TRAINER, rss(0.0), now=t0)
        t = 0.0
        while t <= seconds:
            box.tree.set_memory(TRAINER, rss(t))
            box.tree.set_smaps_rollup(TRAINER, rss(t), rss(t))
            before = len(box.delivered)
            await box.tick(t0 + t)
            leaks += [(t, a) for a in box.delivered[before:] if a.kind == "leak"]
            t += step
    finally:
        box.engine.close()
    return leaks


def steady_then(rate: int, base: int = 1 * GiB, start: float = 60.0) -> Shape:
    """``base`` for ``start`` seconds, then growing at ``rate`` bytes/s (page-aligned)."""
    return lambda t: base + int(max(0.0, t - start) * rate) // 4096 * 4096


def window_of(alert: Alert) -> float:
    m = re.search(r"over the last ([0-9.]+) s;", alert.message)
    assert m, alert.message
    return float(m.group(1))


async def test_a_fast_leak_is_flagged_within_30_s(proc_tree: ProcTree, registry: Registry, tmp_path: Path) -> None:
    """20 MiB/s on a 24 GiB box (the headroom gone in ~20 min): was 149 s (half of
    leak_window of history first); now once it has grown 20 s, at the next evaluation."""
    leaks = await run_leak(proc_tree, registry, tmp_path, steady_then(20 * MiB), 60 + 40)
    t, alert = leaks[0]
    assert (alert.state, alert.severity, alert.pid) == ("firing", "critical", TRAINER)  # gone within 4 h
    assert t - 60 <= 20 + LEAK_EVERY + 1 <= 30
    assert alert.value == pytest.approx(20 * MiB * 60, rel=0.05)
    assert alert.eta_seconds is not None and 15 * 60 < alert.eta_seconds < 21 * 60
    # The window named is the data fitted: from the last value before the growth (t = 60)
    # to now, not leak_window.
    assert window_of(alert) == t - 60
    assert "min at this pace" in alert.message


async def test_a_leak_past_the_headroom_says_it_is_already_gone(proc_tree: ProcTree, registry: Registry,
                                                               tmp_path: Path) -> None:
    """A process growing on a box whose headroom it has already passed: the message says
    so, where it said "gone in 0.0 min" (issue 28)."""
    leaks = await run_leak(proc_tree, registry, tmp_path, steady_then(20 * MiB, base=2 * GiB), 60 + 40,
                           capacity=1 * GiB)
    _, alert = leaks[0]
    assert alert.eta_seconds == 0 and "the headroom is already gone" in alert.message, alert.message
    assert "0.0 min" not in alert.message


async def test_a_slow_leak_is_flagged_within_10_min(proc_tree: ProcTree, registry: Registry, tmp_path: Path) -> None:
    """1 MiB/s (86 GiB a day) on a 24 GiB box: the headroom gone in ~6.7 h, within the
    24 h horizon; it must have grown 1% of that (~4 min). It was never flagged (1 h horizon)."""
    leaks = await run_leak(proc_tree, registry, tmp_path, steady_then(1 * MiB), 60 + 600)
    t, alert = leaks[0]
    assert (alert.state, alert.severity) == ("firing", "warning")
    assert t - 60 <= 300
    assert window_of(alert) == t - 60 >= 0.01 * alert.eta_seconds  # type: ignore[operator]
    assert "h at this pace" in alert.message


def sawtooth(t: float) -> int:
    """Grows 150 MiB over 15 s, drops back, again and again (a batch loop, a GC'd heap)."""
    return 1 * GiB + int((t % 16) * 10 * MiB) // 4096 * 4096


def noisy(t: float, rng: random.Random = random.Random(7)) -> int:  # noqa: B008 - one stream per run
    return 2 * GiB + rng.randrange(-8 * MiB, 8 * MiB, 4096)


@pytest.mark.parametrize("capacity", [24 * GiB, 2 * GiB], ids=["24GiB", "2GiB"])
@pytest.mark.parametrize("shape", [sawtooth, noisy, lambda t: 3 * GiB], ids=["sawtooth", "noisy", "flat"])
async def test_sawtooth_and_steady_processes_are_not_leaks(
    proc_tree: ProcTree, registry: Registry, tmp_path: Path, shape: Shape, capacity: int
) -> None:
    """10 minutes each, on a roomy box and on one where a 10 MiB/s climb would use up the
    headroom in ~1 min: the sawtooth never grows 20 s in a row."""
    assert await run_leak(proc_tree, registry, tmp_path, shape, 600, capacity=capacity) == []


async def test_a_leak_behind_a_sawtooth_is_flagged_and_resolves_when_freed(
    proc_tree: ProcTree, registry: Registry, tmp_path: Path
) -> None:
    """A heap that frees 150 MiB every 16 s yet keeps 32 MiB more each time (2 MiB/s): its
    latest low is its first one, so the whole climb is fitted; once the fit is good (the
    rise ~3 times the sawtooth) it is a leak. Freed, it resolves at the next evaluation."""

    def climbing(t: float) -> int:
        return 500 * MiB if t >= 500 else sawtooth(t) + int(t // 16) * 32 * MiB

    leaks = await run_leak(proc_tree, registry, tmp_path, climbing, 520, capacity=8 * GiB)
    (t_fired, fired), (t_resolved, resolved) = leaks
    assert fired.state == "firing" and t_fired < 300
    assert fired.value == pytest.approx(2 * MiB * 60, rel=0.2)
    assert resolved.state == "resolved" and 500 <= t_resolved <= 500 + LEAK_EVERY
    assert resolved.message.endswith("is not growing")

