"""The fake NVIDIA driver (tests/fakes/fake_nvml.c), exercised through the real, unmodified pynvml:
inventory, memory, process lists, accounting, live state changes, the call log, the state file.

pynvml loads ``libnvidia-ml.so.1`` once per process, so every check runs in a fresh
``python -c`` subprocess whose environment points ``LD_LIBRARY_PATH`` at a fake built by gcc
(once per set of omitted symbols per session; see ``nvml_probe``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from fakes.fakenvml import FakeGpuState, GiB, MiB, nvml_env
from nvml_probe import NA, PRELUDE, run_script, two_gpus


def test_inventory_and_memory(lib_dir: Path, tmp_path: Path) -> None:
    state = two_gpus()
    state.write(tmp_path / "state")
    out = run_script(
        """
        pynvml.nvmlInit()
        r = {"driver": pynvml.nvmlSystemGetDriverVersion(), "count": pynvml.nvmlDeviceGetCount(), "devs": []}
        for i in range(r["count"]):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            m1 = pynvml.nvmlDeviceGetMemoryInfo(h)
            m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            r["devs"].append({
                "index": pynvml.nvmlDeviceGetIndex(h), "name": pynvml.nvmlDeviceGetName(h),
                "uuid": pynvml.nvmlDeviceGetUUID(h),
                "v1": [m1.total, m1.free, m1.used],
                "v2": [m2.version, m2.total, m2.reserved, m2.free, m2.used],
            })
        r["bad_index"] = catch(pynvml.nvmlDeviceGetHandleByIndex, 2)
        pynvml.nvmlShutdown()
        r["after_shutdown"] = catch(pynvml.nvmlDeviceGetCount)
        r["shutdown_twice"] = catch(pynvml.nvmlShutdown)
        emit(r)
        """,
        nvml_env(lib_dir, tmp_path / "state"),
    )
    assert out["driver"] == "550.54.15"
    assert out["count"] == 2
    d0, d1 = out["devs"]
    assert d0["index"] == 0 and d1["index"] == 1
    assert d0["name"] == "NVIDIA H100 80GB HBM3" and d1["name"] == "NVIDIA A100-SXM4-40GB"
    assert d0["uuid"] == "GPU-0000aaaa-1111-2222-3333-444455556666"
    assert d1["uuid"] == state.devices[1].uuid
    assert d0["v1"] == [80 * GiB, 70 * GiB, 10 * GiB]
    assert d0["v2"] == [0x02000028, 80 * GiB, 0, 70 * GiB, 10 * GiB]
    assert d1["v2"][1:] == [40 * GiB, 0, 39 * GiB, 1 * GiB]
    assert out["bad_index"]["exc"] == "NVMLError_InvalidArgument"
    assert out["after_shutdown"]["exc"] == "NVMLError_Uninitialized"
    assert out["shutdown_twice"]["exc"] == "NVMLError_Uninitialized"


def test_no_state_file_means_no_gpu(lib_dir: Path, tmp_path: Path) -> None:
    out = run_script(
        """
        pynvml.nvmlInit()
        emit({"count": pynvml.nvmlDeviceGetCount(), "h": catch(pynvml.nvmlDeviceGetHandleByIndex, 0)})
        """,
        nvml_env(lib_dir, tmp_path / "missing"),
    )
    assert out == {"count": 0, "h": {"exc": "NVMLError_InvalidArgument", "nvml_error": True, "value": 2}}


def test_calls_before_init_are_uninitialized(lib_dir: Path, tmp_path: Path) -> None:
    two_gpus().write(tmp_path / "state")
    out = run_script(
        """
        pynvml._LoadNvmlLibrary()  # loaded, not initialised: the C side must answer
        emit([catch(pynvml.nvmlDeviceGetCount), catch(pynvml.nvmlSystemGetDriverVersion)])
        """,
        nvml_env(lib_dir, tmp_path / "state"),
    )
    assert [r["exc"] for r in out] == ["NVMLError_Uninitialized"] * 2


def test_running_processes_v3(lib_dir: Path, tmp_path: Path) -> None:
    state = two_gpus()
    state.add_proc(0, 1234, 512 * MiB)
    state.add_proc(0, 5678, None)  # usedGpuMemory not available
    state.add_proc(0, 4242, 64 * MiB, kind="graphics")
    state.add_proc(1, 9999, 2 * GiB)
    state.write(tmp_path / "state")
    out = run_script(
        """
        pynvml.nvmlInit()
        h0, h1 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
        emit({
            "c0": procs(pynvml.nvmlDeviceGetComputeRunningProcesses(h0)),
            "g0": procs(pynvml.nvmlDeviceGetGraphicsRunningProcesses(h0)),
            "c1": procs(pynvml.nvmlDeviceGetComputeRunningProcesses(h1)),
            "g1": procs(pynvml.nvmlDeviceGetGraphicsRunningProcesses(h1)),
            "c0_v2": procs(pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h0)),
            "g0_v2": procs(pynvml.nvmlDeviceGetGraphicsRunningProcesses_v2(h0)),
        })
        """,
        nvml_env(lib_dir, tmp_path / "state"),
    )
    assert out["c0"] == [[1234, 512 * MiB, NA, NA], [5678, None, NA, NA]]
    assert out["g0"] == [[4242, 64 * MiB, NA, NA]]
    assert out["c1"] == [[9999, 2 * GiB, NA, NA]]
    assert out["g1"] == []
    assert out["c0_v2"] == out["c0"]
    assert out["g0_v2"] == out["g0"]


def test_accounting(lib_dir: Path, tmp_path: Path) -> None:
    state = two_gpus()  # accounting off on 0, on on 1
    state.set_accounting_max(1, 4321, 3 * GiB)
    state.set_accounting_max(0, 4321, 1 * GiB)
    state.write(tmp_path / "state")
    out = run_script(
        """
        pynvml.nvmlInit()
        h0, h1 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
        s = pynvml.nvmlDeviceGetAccountingStats(h1, 4321)
        emit({
            "modes": [pynvml.nvmlDeviceGetAccountingMode(h0), pynvml.nvmlDeviceGetAccountingMode(h1)],
            "stats": [s.maxMemoryUsage, s.isRunning, s.gpuUtilization, s.memoryUtilization, s.time, s.startTime],
            "unknown": catch(pynvml.nvmlDeviceGetAccountingStats, h1, 1),
            "disabled": catch(pynvml.nvmlDeviceGetAccountingStats, h0, 4321),
            "enabled": pynvml.NVML_FEATURE_ENABLED, "disabled_value": pynvml.NVML_FEATURE_DISABLED,
        })
        """,
        nvml_env(lib_dir, tmp_path / "state"),
    )
    assert out["modes"] == [out["disabled_value"], out["enabled"]] == [0, 1]
    assert out["stats"] == [3 * GiB, 1, 0, 0, 0, 0]
    assert out["unknown"]["exc"] == "NVMLError_NotFound"
    assert out["disabled"]["exc"] == "NVMLError_NotSupported"


def test_live_state_change(lib_dir: Path, tmp_path: Path) -> None:
    """The library re-reads the state file on each call: one process sees the change."""
    state_file = tmp_path / "state"
    state = two_gpus()
    state.add_proc(0, 1234, 100 * MiB)
    state.write(state_file)
    script = """
        pynvml.nvmlInit()
        h0, h1 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
        def snap():
            return {"procs": procs(pynvml.nvmlDeviceGetComputeRunningProcesses(h0)),
                    "used": pynvml.nvmlDeviceGetMemoryInfo(h0, version=pynvml.nvmlMemory_v2).used,
                    "h1": catch(lambda: pynvml.nvmlDeviceGetMemoryInfo(h1).used)}
        emit(snap())
        sys.stdin.readline()
        emit(snap())
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(script)],
        env=nvml_env(lib_dir, state_file),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        first = json.loads(proc.stdout.readline())
        state.device(0).used = 20 * GiB
        state.procs[0].used = 3 * GiB
        state.add_proc(0, 5678, None)
        state.device(1).lost = True
        state.write(state_file)
        stdout, stderr = proc.communicate("go\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    second = json.loads(stdout.strip().splitlines()[-1])
    assert first == {"procs": [[1234, 100 * MiB, NA, NA]], "used": 10 * GiB, "h1": {"ok": 1 * GiB}}
    assert second["procs"] == [[1234, 3 * GiB, NA, NA], [5678, None, NA, NA]]
    assert second["used"] == 20 * GiB
    assert second["h1"]["exc"] == "NVMLError_GpuIsLost"


def test_call_log_counts_calls(lib_dir: Path, tmp_path: Path) -> None:
    state = two_gpus()
    state.add_proc(0, 1, 1 * MiB)
    state.add_proc(0, 2, 2 * MiB)
    state.add_proc(0, 3, 3 * MiB, kind="graphics")
    state.write(tmp_path / "state")
    log = tmp_path / "calls.log"
    run_script(
        """
        pynvml.nvmlInit()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)
        pynvml.nvmlShutdown()
        emit(None)
        """,
        nvml_env(lib_dir, tmp_path / "state", log=log),
    )
    calls = Counter(log.read_text().splitlines())
    assert calls == {
        "nvmlInitWithFlags": 1,
        "nvmlDeviceGetCount_v2": 1,
        "nvmlDeviceGetHandleByIndex_v2": 2,
        "nvmlDeviceGetMemoryInfo_v2": 2,
        # count-then-fill: two calls where there are processes, one where there are none
        "nvmlDeviceGetComputeRunningProcesses_v3": 2 + 1,
        "nvmlDeviceGetGraphicsRunningProcesses_v3": 2 + 1,
        "nvmlShutdown": 1,
    }


def test_state_file_format(tmp_path: Path) -> None:
    state = FakeGpuState(driver="535.104.05")
    state.add_device("Tesla T4", total=16 * GiB, used=5, accounting=True)
    state.add_proc(0, 77, None, kind="graphics")
    state.set_accounting_max(0, 77, 9)
    state.inject_error("nvmlShutdown", 999)
    state.inject_error("nvmlDeviceGetName", 15, device=0)
    state.write(tmp_path / "s")
    lines = [ln for ln in (tmp_path / "s").read_text().splitlines() if not ln.startswith("#")]
    assert lines == [
        "driver 535.104.05",
        f"device 0 GPU-fa4e0000-0000-4000-8000-000000000000 {16 * GiB} 5 1 0 Tesla T4",
        "proc 0 graphics 77 na",
        "acct 0 77 9",
        "error nvmlShutdown 999",
        "error nvmlDeviceGetName 15 0",
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["s"]  # no temporary file left behind
    with pytest.raises(ValueError):
        FakeGpuState(driver="5 5").render()
