"""GPU memory end to end: the real daemon, unmodified pynvml, the fake libnvidia-ml.so.1
(tests/fakes) on LD_LIBRARY_PATH, real target processes. No Python mock of pynvml."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Daemon, Target, memagent_cli
from fakes.fakenvml import FakeGpuState, GiB, MiB, build_fake_nvml, nvml_env

from memagent.client import Client
from memproto.frames import Sample
from memproto.records import DaemonStatus, ProcessInfo

V3 = ["nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3"]
GPU_IS_LOST, DRIVER_NOT_LOADED = 15, 9


@pytest.fixture(scope="session")
def fake_libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not on PATH: cannot build the fake NVML library")
    root = tmp_path_factory.mktemp("fake-nvml")
    return {
        "full": build_fake_nvml(root / "full"),
        "no_v3": build_fake_nvml(root / "no-v3", omit=V3),
    }


class Gpus:
    """The fake driver's state file and the daemon environment that reads it."""

    def __init__(self, lib: Path, tmp: Path) -> None:
        self.lib = lib
        self.file = tmp / "gpu-state"
        self.log = tmp / "nvml-calls"
        self.state = FakeGpuState()

    def write(self) -> None:
        self.state.write(self.file)

    def env(self) -> dict[str, str]:
        return nvml_env(self.lib, self.file, self.log)


@pytest.fixture
def gpus(fake_libs: dict[str, Path], tmp_path: Path) -> Iterator[Gpus]:
    yield Gpus(fake_libs["full"], tmp_path)


def until_listed(
    c: Client, pred: Callable[[dict[int, ProcessInfo]], bool], frames: int = 100
) -> dict[int, ProcessInfo]:
    """Read samples (one per tick) until the daemon's list satisfies ``pred``."""
    c.subscribe()
    for n, frame in enumerate(c.stream()):
        if isinstance(frame, Sample):
            listed = {p.pid: p for p in c.list()}
            if pred(listed):
                return listed
        if n > frames:
            break
    raise AssertionError("the daemon never reported the expected GPU state")


def test_vram_per_process_on_two_gpus(
    gpus: Gpus, start_daemon: Callable[..., Daemon], make_target: Callable[..., Target]
) -> None:
    a, b, cpu_only = make_target(), make_target(), make_target()
    gpus.state.add_device("NVIDIA H100 80GB HBM3", 80 * GiB, 20 * GiB, uuid="GPU-aaaa")
    gpus.state.add_device("NVIDIA H100 80GB HBM3", 80 * GiB, 6 * GiB, uuid="GPU-bbbb")
    gpus.state.add_proc(0, a.pid, 1 * GiB)
    gpus.state.add_proc(0, b.pid, 512 * MiB)
    gpus.state.add_proc(1, b.pid, 2 * GiB, kind="graphics")
    gpus.write()
    d = start_daemon("--interval", "0.1", env=gpus.env())
    with d.client() as c:
        c.attach([a.pid, b.pid, cpu_only.pid])
        listed = until_listed(c, lambda ps: ps[b.pid].vram_bytes == 2 * GiB + 512 * MiB)
        assert listed[a.pid].vram_bytes == 1 * GiB
        assert [(g.index, g.uuid, g.used_bytes) for g in listed[a.pid].gpus] == [(0, "GPU-aaaa", 1 * GiB)]
        assert sorted((g.index, g.used_bytes) for g in listed[b.pid].gpus) == [(0, 512 * MiB), (1, 2 * GiB)]
        assert listed[cpu_only.pid].vram_bytes == 0 and listed[cpu_only.pid].gpus == []
    # The command-line contract, as scripts read it.
    r = memagent_cli("ls", "--socket", d.socket, "--json")
    items = {i["pid"]: i for i in json.loads(r.stdout)}
    assert items[a.pid]["vram_bytes"] == 1 * GiB and items[a.pid]["vram_peak_bytes"] == 1 * GiB
    assert items[a.pid]["vram_peak_exact"] is False
    assert items[a.pid]["gpus"] == [{"index": 0, "uuid": "GPU-aaaa", "used_bytes": 1 * GiB}]
    r = memagent_cli("status", "--socket", d.socket, "--json")
    status = json.loads(r.stdout)
    assert status["gpu_available"] is True and status["host"]["total_bytes"] > 0
    assert status["gpus"] == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-aaaa", "total_bytes": 80 * GiB,
         "used_bytes": 20 * GiB, "lost": False},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-bbbb", "total_bytes": 80 * GiB,
         "used_bytes": 6 * GiB, "lost": False},
    ]


def test_exact_peak_from_accounting_and_sampled_peak_elsewhere(
    gpus: Gpus, start_daemon: Callable[..., Daemon], make_target: Callable[..., Target]
) -> None:
    exact, sampled = make_target(), make_target()
    gpus.state.add_device(total=80 * GiB, accounting=True)
    gpus.state.add_device(total=80 * GiB, accounting=False)
    gpus.state.add_proc(0, exact.pid, 1 * GiB)
    gpus.state.set_accounting_max(0, exact.pid, 3 * GiB)  # a peak the samples never saw
    gpus.state.add_proc(1, sampled.pid, 2 * GiB)
    gpus.write()
    d = start_daemon("--interval", "0.1", env=gpus.env())
    with d.client() as c:
        c.attach([exact.pid, sampled.pid])
        listed = until_listed(c, lambda ps: ps[exact.pid].vram_peak_exact)
        assert listed[exact.pid].vram_peak_bytes == 3 * GiB and listed[exact.pid].vram_bytes == 1 * GiB
        # Sampled: the peak follows what was seen, and stays after the usage drops.
        gpus.state.remove_procs(sampled.pid)
        gpus.state.add_proc(1, sampled.pid, 5 * GiB)
        gpus.write()
        until_listed(c, lambda ps: ps[sampled.pid].vram_bytes == 5 * GiB)
        gpus.state.remove_procs(sampled.pid)
        gpus.state.add_proc(1, sampled.pid, 1 * GiB)
        gpus.write()
        listed = until_listed(c, lambda ps: ps[sampled.pid].vram_bytes == 1 * GiB)
        assert listed[sampled.pid].vram_peak_bytes == 5 * GiB and not listed[sampled.pid].vram_peak_exact


def test_driver_without_v3_calls_falls_back_to_v2(
    fake_libs: dict[str, Path], tmp_path: Path, start_daemon: Callable[..., Daemon],
    make_target: Callable[..., Target],
) -> None:
    g = Gpus(fake_libs["no_v3"], tmp_path)
    t = make_target()
    g.state.add_device(total=16 * GiB)
    g.state.add_proc(0, t.pid, 700 * MiB)
    g.write()
    d = start_daemon("--interval", "0.1", env=g.env())
    with d.client() as c:
        c.attach([t.pid])
        listed = until_listed(c, lambda ps: ps[t.pid].vram_bytes is not None and ps[t.pid].vram_bytes > 0)
        assert listed[t.pid].vram_bytes == 700 * MiB
    assert "_v2" in d.log  # said once, in the log


def test_unknown_usage_is_null_never_zero(
    gpus: Gpus, start_daemon: Callable[..., Daemon], make_target: Callable[..., Target]
) -> None:
    t = make_target()
    gpus.state.add_device(total=16 * GiB)
    gpus.state.add_proc(0, t.pid, None)
    gpus.write()
    d = start_daemon("--interval", "0.1", env=gpus.env())
    with d.client() as c:
        c.attach([t.pid])
        listed = until_listed(c, lambda ps: bool(ps[t.pid].gpus))
        assert listed[t.pid].vram_bytes is None
        assert [(g.index, g.used_bytes) for g in listed[t.pid].gpus] == [(0, None)]
    r = memagent_cli("ls", "--socket", d.socket)
    row = next(line for line in r.stdout.splitlines() if str(t.pid) in line)
    assert "n/a" in row


def test_a_lost_gpu_is_marked_and_the_rest_goes_on(
    gpus: Gpus, start_daemon: Callable[..., Daemon], make_target: Callable[..., Target]
) -> None:
    t = make_target()
    gpus.state.add_device(total=16 * GiB)
    gpus.state.add_device(total=16 * GiB)
    gpus.state.add_proc(0, t.pid, 1 * GiB)
    gpus.state.add_proc(1, t.pid, 1 * GiB)
    gpus.write()
    d = start_daemon("--interval", "0.1", env=gpus.env())
    with d.client() as c:
        c.attach([t.pid])
        until_listed(c, lambda ps: ps[t.pid].vram_bytes == 2 * GiB)
        gpus.state.device(1).lost = True
        gpus.state.remove_procs(t.pid, device=0)
        gpus.state.add_proc(0, t.pid, 3 * GiB)
        gpus.write()
        listed = until_listed(c, lambda ps: ps[t.pid].vram_bytes == 3 * GiB)
        assert [g.index for g in listed[t.pid].gpus] == [0]
        status = c.status()
        assert [g.lost for g in status.gpus] == [False, True] and status.gpu_available
        # Host memory sampling goes on: RSS still moves.
        t.do("alloc 40")
        until_listed(c, lambda ps: ps[t.pid].rss_bytes >= 40 * MiB)
    assert sum("is lost" in line for line in d.lines) == 1


def _status(d: Daemon) -> DaemonStatus:
    with d.client() as c:
        c.subscribe()
        seen = 0
        for frame in c.stream():  # a few ticks: enough for a retry storm to show in the log
            seen += isinstance(frame, Sample)
            if seen == 5:
                return c.status()
    raise AssertionError("no samples")


def test_no_nvidia_library_means_not_available_said_once(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target]
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "FAKE_NVML_STATE")}
    if any(Path(p, "libnvidia-ml.so.1").exists() for p in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")):
        pytest.skip("this machine has a real NVIDIA library")
    t = make_target()
    d = start_daemon("--interval", "0.05", env=env)
    with d.client() as c:
        (info,) = c.attach([t.pid]).attached
        assert info.vram_bytes is None and info.vram_peak_bytes is None
    status = _status(d)
    assert not status.gpu_available and status.gpus == []
    assert status.gpu_note == "NVIDIA library (libnvidia-ml.so.1) not found"
    assert sum("GPU memory not available" in line for line in d.lines) == 1


def test_nvml_init_failing(gpus: Gpus, start_daemon: Callable[..., Daemon]) -> None:
    gpus.state.add_device(total=16 * GiB)
    gpus.state.inject_error("nvmlInitWithFlags", DRIVER_NOT_LOADED)
    gpus.write()
    d = start_daemon("--interval", "0.05", env=gpus.env())
    status = _status(d)
    assert not status.gpu_available and status.gpu_note == "NVIDIA driver not loaded"
    r = memagent_cli("status", "--socket", d.socket)
    assert "GPU memory: not available (NVIDIA driver not loaded)" in r.stdout


def test_nvml_is_read_once_per_device_per_tick(
    gpus: Gpus, start_daemon: Callable[..., Daemon], make_target: Callable[..., Target]
) -> None:
    targets = [make_target() for _ in range(6)]
    gpus.state.add_device(total=16 * GiB)
    for t in targets:
        gpus.state.add_proc(0, t.pid, 100 * MiB)
    gpus.write()
    d = start_daemon("--interval", "0.1", env=gpus.env())
    with d.client() as c:
        c.attach([t.pid for t in targets])
        until_listed(c, lambda ps: all(p.vram_bytes == 100 * MiB for p in ps.values()))
        before = c.status().tick.ticks
        calls_before = gpus.log.read_text().count("nvmlDeviceGetMemoryInfo_v2\n")
        lists_before = gpus.log.read_text().count("nvmlDeviceGetComputeRunningProcesses_v3\n")
        until_listed(c, lambda ps: True, frames=1)
        for _ in range(10):
            next(f for f in c.stream() if isinstance(f, Sample))
        ticks = c.status().tick.ticks - before
        log = gpus.log.read_text()
    memory_calls = log.count("nvmlDeviceGetMemoryInfo_v2\n") - calls_before
    list_calls = log.count("nvmlDeviceGetComputeRunningProcesses_v3\n") - lists_before
    # One memory read per tick (+/- the tick in flight), and the process list read twice
    # per tick by pynvml's size-then-fill pattern: never once per process.
    assert abs(memory_calls - ticks) <= 1, (memory_calls, ticks)
    assert abs(list_calls - 2 * ticks) <= 2, (list_calls, ticks)


def test_pids_from_another_pid_namespace_are_detected(
    gpus: Gpus, start_daemon: Callable[..., Daemon], make_target: Callable[..., Target]
) -> None:
    """NVML reports host PIDs; a daemon in a container sees none of them: it says so."""
    gpus.state.add_device(total=16 * GiB)
    gpus.state.add_proc(0, 4_000_000, 1 * GiB)  # above any pid_max: exists nowhere here
    gpus.write()
    d = start_daemon("--interval", "0.05", env=gpus.env())
    status = _status(d)
    assert status.gpu_available and not status.host_pid_namespace
    assert sum("not in the host PID namespace" in line for line in d.lines) == 1
    r = memagent_cli("status", "--socket", d.socket)
    assert "nested PID namespace" in r.stdout


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="unshare of a PID namespace needs root")
def test_a_nested_pid_namespace_is_detected_at_start() -> None:
    import subprocess
    import sys

    probe = "from memagent.proc.nvml import in_host_pid_namespace as f; print(f())"
    here = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    nested = subprocess.run(["unshare", "--pid", "--fork", sys.executable, "-c", probe],
                            capture_output=True, text=True, check=True)
    assert (here.stdout.strip(), nested.stdout.strip()) == ("True", "False")
