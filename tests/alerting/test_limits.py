"""Cgroup limits as headroom resources of their own (:mod:`memagent.alerting.limits`): the
real alert engine, sampler and registry over a fixture /proc tree whose processes are in
cgroups of a fixture cgroup tree (``tests/fixtures/cgroupfs/``, v2 and v1), copied so that
a test can change a limit or a usage as the kernel would."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from proctree import GiB, MiB, ProcTree

from memagent.alerting.engine import AlertEngine
from memagent.alerting.limits import LIMITS_EVERY, USAGE_EVERY
from memagent.config import AlertConfig, HeadroomConfig
from memagent.core.registry import Registry
from memagent.core.sampler import Sampler
from memagent.proc.kmsg import KernelLog
from memproto.records import Alert, Contributor, Headroom

TREES = Path(__file__).resolve().parent.parent / "fixtures" / "cgroupfs"
ID = "3f1c5e2a9b7d4c6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6"
ID2 = "9a8b7c6d5e4f30211f2e3d4c5b6a79881726354453627180a9b8c7d6e5f40312"
DOCKER = f"/system.slice/docker-{ID}.scope"
POD = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f2e4c6a_8b1d_4e3f_9a7c_5d6e7f8a9b0c.slice"


class Box:
    """The engine over the fixture trees, ticked as the agent ticks it."""

    def __init__(self, tree: ProcTree, registry: Registry, tmp_path: Path, version: str) -> None:
        self.tree = tree
        self.registry = registry
        self.cgroups = tmp_path / "cgroupfs"
        shutil.copytree(TREES / version, self.cgroups)
        (tmp_path / "kmsg").write_bytes(b"")
        tree.set_meminfo(32 * GiB, 24 * GiB)
        self.delivered: list[Alert] = []
        self.sampler = Sampler(registry, interval=0.5)
        # The host's capacity is configured large: only the cgroups' limits are near.
        self.engine = AlertEngine(registry, HeadroomConfig(host_capacity=16 * GiB), AlertConfig(),
                                  self.delivered.append, lambda w: None, kmsg=KernelLog(str(tmp_path / "kmsg")),
                                  cgroup_root=str(self.cgroups))

    def start(self, pid: int, rss: int, cgroup_line: str) -> None:
        """A process of ``rss`` bytes (none of it shared) whose /proc/PID/cgroup is that line."""
        self.tree.add_process(pid, f"worker-{pid}", rss=rss)
        self.tree.write(pid, "cgroup", cgroup_line + "\n")
        self.tree.set_smaps_rollup(pid, rss, rss)
        self.registry.attach(pid, now=1000.0)

    def write(self, relative: str, content: str) -> None:
        (self.cgroups / relative.lstrip("/")).write_text(content)

    async def tick(self, now: float) -> None:
        self.engine.on_tick(now, self.sampler.sample(now).exited, [], changed=True)
        await self.engine.pss_settled()

    def view(self, resource: str) -> Headroom:
        return next(h for h in self.engine.headroom if h.resource == resource)


@pytest.fixture
def v2(proc_tree: ProcTree, registry: Registry, tmp_path: Path) -> Iterator[Box]:
    b = Box(proc_tree, registry, tmp_path, "v2")
    yield b
    b.engine.close()


async def test_a_containers_limit_is_a_resource_of_its_own_and_its_alert_names_it(v2: Box) -> None:
    v2.start(5001, 300 * MiB, f"0::{DOCKER}")
    await v2.tick(1000.0)
    resource = f"cgroup:{DOCKER}"
    assert [h.resource for h in v2.engine.headroom] == ["host", resource]
    view = v2.view(resource)
    # memory.current 700 MiB less 100 MiB inactive file pages: 600 MiB, 300 of them watched.
    assert (view.name, view.limit_bytes, view.reserve_bytes, view.unwatched_bytes) == \
        (f"docker {ID[:12]}", 1 * GiB, 0, 300 * MiB)
    assert (view.capacity_bytes, view.sum_peaks_bytes) == (724 * MiB, 300 * MiB)
    assert view.top == [Contributor(5001, "worker-5001", 300 * MiB)]
    assert v2.view("host").limit_bytes == 32 * GiB  # the host's own limit is the box's memory
    assert v2.delivered == []

    (w,) = v2.registry.alive
    w.set_identity(w.identity, "web")  # its name was read (memagent.core.containers)
    v2.tree.set_memory(5001, 950 * MiB)
    v2.write(f"{DOCKER}/memory.current", f"{1050 * MiB}\n")  # 950 MiB its own, all of it watched
    await v2.tick(1000.0 + USAGE_EVERY)
    (alert,) = v2.delivered
    assert (alert.kind, alert.resource, alert.severity) == ("headroom", resource, "warning")
    assert alert.message == ("container web: Σ peaks 950 MiB would use 93% of the 1.00 GiB headroom "
                             "of its 1.00 GiB limit; seen together at most 950 MiB (93%)")
    assert v2.view(resource).name == "docker web"
    assert v2.view("host").ratio == pytest.approx(950 / (16 * 1024))  # the host's entry as it was


async def test_a_process_in_no_limited_cgroup_adds_no_entry(v2: Box) -> None:
    v2.start(5001, 300 * MiB, "0::/system.slice/nowhere.service")  # no memory.max: no limit
    v2.start(5002, 300 * MiB, "0::/system.slice/big.service")  # 1 TiB: not below the box's memory
    v2.start(5003, 300 * MiB, "0::/")
    await v2.tick(1000.0)
    assert [h.resource for h in v2.engine.headroom] == ["host"]
    assert v2.engine.limits.faults == []


async def test_a_pods_limit_holds_its_containers_processes(v2: Box) -> None:
    """The limit is on the pod's cgroup, the processes in a container's below it (the
    container's own has none): the pod's entry holds them, named by the pod."""
    v2.start(5001, 200 * MiB, f"0::{POD}/cri-containerd-{ID2}.scope")
    v2.start(5002, 100 * MiB, "0::/system.slice/ollama.service")  # a unit with MemoryMax
    await v2.tick(1000.0)
    w = v2.registry.find_alive(5001)
    assert w is not None and w.identity.pod_uid is not None
    w.set_identity(w.identity, "edge/detector-7c9f/yolo")
    await v2.tick(1000.5)
    pod = v2.view(f"cgroup:{POD}")
    assert (pod.name, pod.limit_bytes, pod.sum_peaks_bytes, pod.unwatched_bytes) == \
        ("kubernetes pod edge/detector-7c9f", 2 * GiB, 200 * MiB, 100 * MiB)
    unit = v2.view("cgroup:/system.slice/ollama.service")
    assert (unit.name, unit.capacity_bytes, unit.sum_peaks_bytes) == ("ollama.service", 512 * MiB, 100 * MiB)


async def test_a_malformed_limit_is_a_one_line_fault_and_the_engine_goes_on(v2: Box) -> None:
    v2.start(5001, 100 * MiB, "0::/bad.slice/garbage.service")
    v2.start(5002, 100 * MiB, "0::/bad.slice/nostat.service")
    await v2.tick(1000.0)
    (fault_max, fault_stat) = v2.engine.limits.faults
    assert fault_max.endswith("garbage.service/memory.max: not a byte count: b'lots'")
    assert fault_stat.endswith("nostat.service/memory.stat: not a byte count: b'many'")
    # The limit that parses stands; its unwatched use is the usage alone (200 MiB, 100 watched).
    (view,) = v2.engine.headroom[1:]
    assert (view.resource, view.capacity_bytes) == ("cgroup:/bad.slice/nostat.service", 156 * MiB)
    v2.write("bad.slice/garbage.service/memory.max", f"{512 * MiB}\n")
    await v2.tick(1000.0 + LIMITS_EVERY)
    assert [h.resource for h in v2.engine.headroom[1:]] == ["cgroup:/bad.slice/garbage.service",
                                                           "cgroup:/bad.slice/nostat.service"]
    # Its usage does not parse: unknown, 0 unwatched; the fault says so.
    assert v2.view("cgroup:/bad.slice/garbage.service").capacity_bytes == 512 * MiB
    assert [f.rpartition("/bad.slice/")[2] for f in v2.engine.limits.faults] == [
        "garbage.service/memory.current: not a byte count: b'12x'",
        "nostat.service/memory.stat: not a byte count: b'many'"]


async def test_a_limit_lifted_resolves_its_alert(v2: Box) -> None:
    v2.start(5001, 1000 * MiB, f"0::{DOCKER}")
    await v2.tick(1000.0)  # not judged before its PSS is read (it was, meanwhile)
    assert v2.delivered == []
    await v2.tick(1000.5)
    assert [(a.resource, a.state) for a in v2.delivered] == [(f"cgroup:{DOCKER}", "firing")]
    v2.write(f"{DOCKER}/memory.max", "max\n")
    await v2.tick(1000.0 + LIMITS_EVERY)
    assert [h.resource for h in v2.engine.headroom] == ["host"]
    resolved = v2.delivered[-1]
    assert (resolved.resource, resolved.state) == (f"cgroup:{DOCKER}", "resolved")
    assert resolved.message == f"resolved: cgroup:{DOCKER} has no limit or no watched process any more"


async def test_a_v1_containers_limit(proc_tree: ProcTree, registry: Registry, tmp_path: Path) -> None:
    box = Box(proc_tree, registry, tmp_path, "v1")
    try:
        box.start(5001, 100 * MiB, f"12:memory:/docker/{ID}\n0::/")
        await box.tick(1000.0)
        view = box.view(f"cgroup:/docker/{ID}")
        # usage 150 MiB less 40 MiB total_inactive_file: 110 MiB, 100 of them watched.
        assert (view.name, view.limit_bytes, view.unwatched_bytes, view.capacity_bytes) == \
            (f"docker {ID[:12]}", 256 * MiB, 10 * MiB, 246 * MiB)
    finally:
        box.engine.close()


async def test_a_leak_in_a_container_is_timed_against_the_containers_headroom(v2: Box) -> None:
    """1 MiB/s from 200 MiB in a 1 GiB container whose unwatched processes use 370 MiB:
    what is left of its headroom (~424 MiB) is gone in ~7 min, a critical leak; against
    the host's 16 GiB it would be hours, a warning."""
    t0 = 10_000.0
    v2.start(5001, 200 * MiB, f"0::{DOCKER}")
    leaks: list[Alert] = []
    for t in range(60):
        rss = 200 * MiB + max(0, t - 10) * MiB
        v2.tree.set_memory(5001, rss)
        v2.tree.set_smaps_rollup(5001, rss, rss)
        await v2.tick(t0 + t)
        leaks += [a for a in v2.delivered if a.kind == "leak" and a not in leaks]
    alert = leaks[0]
    assert (alert.pid, alert.severity) == (5001, "critical")
    assert alert.eta_seconds is not None and 6 * 60 < alert.eta_seconds < 8 * 60


async def test_a_sigkill_in_a_full_container_is_an_inferred_oom_kill(v2: Box) -> None:
    """The container near its limit, the box relaxed: a SIGKILL there is taken for the
    OOM killer's (the host's ratio alone would say a plain kill -9)."""
    v2.start(5001, 950 * MiB, f"0::{DOCKER}")
    v2.write(f"{DOCKER}/memory.current", f"{1050 * MiB}\n")
    await v2.tick(1000.0)
    await v2.tick(1000.5)
    assert [(a.kind, a.resource) for a in v2.delivered] == [("headroom", f"cgroup:{DOCKER}")]
    v2.tree.exit(5001, signal=9)
    await v2.tick(1001.0)
    (oom,) = [a for a in v2.delivered if a.kind == "oom-kill"]
    assert (oom.pid, oom.source) == (5001, "inferred")
