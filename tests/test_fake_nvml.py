"""The fake NVIDIA driver (tests/fakes/fake_nvml.c), exercised through the real, unmodified pynvml.

pynvml loads ``libnvidia-ml.so.1`` once per process, so every check runs in a fresh
``python -c`` subprocess whose environment points ``LD_LIBRARY_PATH`` at a fake built by gcc
(once per set of omitted symbols per session).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from fakes.fakenvml import FakeGpuState, GiB, MiB, build_fake_nvml, nvml_env

NA = 0xFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE_uint: gpuInstanceId / computeInstanceId without MIG

# Runs before each script: pynvml, and catch() turning an outcome into JSON-able data.
PRELUDE = """
import json, sys
import pynvml

def catch(fn, *args, **kwargs):
    try:
        return {"ok": fn(*args, **kwargs)}
    except Exception as exc:
        return {"exc": type(exc).__name__, "nvml_error": isinstance(exc, pynvml.NVMLError),
                "value": getattr(exc, "value", None)}

def procs(items):
    return [[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId] for p in items]

def emit(result):
    print(json.dumps(result), flush=True)
"""

BuildFn = Callable[..., Path]


@pytest.fixture(scope="session")
def build_lib(tmp_path_factory: pytest.TempPathFactory) -> BuildFn:
    """Build (once per session per variant) a fake NVML; returns its directory."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not on PATH: cannot build the fake NVML library")
    cache: dict[tuple[tuple[str, ...], tuple[str, ...]], Path] = {}

    def build(omit: Sequence[str] = (), defines: Sequence[str] = ()) -> Path:
        key = (tuple(sorted(omit)), tuple(sorted(defines)))
        if key not in cache:
            out = tmp_path_factory.mktemp("fake-nvml")
            cache[key] = build_fake_nvml(out, omit, defines=dict.fromkeys(defines))
        return cache[key]

    return build


@pytest.fixture(scope="session")
def lib_dir(build_lib: BuildFn) -> Path:
    return build_lib()


def run_script(script: str, env: dict[str, str]) -> Any:
    """Run PRELUDE + script in a fresh interpreter; return the JSON of its last stdout line."""
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"script failed ({proc.returncode}):\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def two_gpus() -> FakeGpuState:
    state = FakeGpuState(driver="550.54.15")
    state.add_device(
        "NVIDIA H100 80GB HBM3", total=80 * GiB, used=10 * GiB, uuid="GPU-0000aaaa-1111-2222-3333-444455556666"
    )
    state.add_device("NVIDIA A100-SXM4-40GB", total=40 * GiB, used=1 * GiB, accounting=True)
    return state


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


def test_old_driver_without_v3_and_memory_v2(build_lib: BuildFn, tmp_path: Path) -> None:
    lib = build_lib(
        omit=[
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
            "nvmlDeviceGetMemoryInfo_v2",
        ]
    )
    state = two_gpus()
    state.add_proc(0, 1234, 512 * MiB)
    state.write(tmp_path / "state")
    out = run_script(
        """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        emit({
            "compute": catch(pynvml.nvmlDeviceGetComputeRunningProcesses, h),
            "graphics": catch(pynvml.nvmlDeviceGetGraphicsRunningProcesses, h),
            "compute_v2": procs(pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h)),
            "mismatch_is_nvml_error": issubclass(pynvml.NVMLLibraryMismatchError, pynvml.NVMLError),
            "memory_v2": catch(pynvml.nvmlDeviceGetMemoryInfo, h, version=pynvml.nvmlMemory_v2),
            "memory_v1_used": pynvml.nvmlDeviceGetMemoryInfo(h).used,
        })
        """,
        nvml_env(lib, tmp_path / "state"),
    )
    assert out["compute"] == {"exc": "NVMLLibraryMismatchError", "nvml_error": False, "value": None}
    assert out["graphics"]["exc"] == "NVMLLibraryMismatchError"
    assert out["mismatch_is_nvml_error"] is False
    assert out["compute_v2"] == [[1234, 512 * MiB, NA, NA]]
    # No such wrapper for memory info: the missing symbol is a plain NVMLError.
    assert out["memory_v2"] == {"exc": "NVMLError_FunctionNotFound", "nvml_error": True, "value": 13}
    assert out["memory_v1_used"] == 10 * GiB


def test_r535_v3_stride_is_misread_by_pynvml(build_lib: BuildFn, tmp_path: Path) -> None:
    """With 32-byte _v3 entries (early R535 drivers) pynvml 13.x, reading 24-byte ones, gets garbage."""
    lib = build_lib(defines=["FAKE_NVML_PROC_V3_CC"])
    state = two_gpus()
    state.add_proc(0, 1234, 512 * MiB)
    state.add_proc(0, 5678, 256 * MiB)
    state.write(tmp_path / "state")
    out = run_script(
        """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        emit({"v3": procs(pynvml.nvmlDeviceGetComputeRunningProcesses(h)),
              "v2": procs(pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h))})
        """,
        nvml_env(lib, tmp_path / "state"),
    )
    assert out["v2"] == [[1234, 512 * MiB, NA, NA], [5678, 256 * MiB, NA, NA]]
    # Entry 1 is read 8 bytes early: the zero usedGpuCcProtectedMemory becomes the pid and the
    # real pid becomes usedGpuMemory (the "pid and memory swapped" reports of R535 days).
    assert out["v3"][0] == [1234, 512 * MiB, NA, NA]
    assert out["v3"][1][:2] == [0, 5678]


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


def test_lost_gpu(lib_dir: Path, tmp_path: Path) -> None:
    state = two_gpus()
    state.device(1).lost = True
    state.write(tmp_path / "state")
    out = run_script(
        """
        pynvml.nvmlInit()
        h0, h1 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
        emit({
            "memory": catch(pynvml.nvmlDeviceGetMemoryInfo, h1, version=pynvml.nvmlMemory_v2),
            "name": catch(pynvml.nvmlDeviceGetName, h1),
            "procs": catch(pynvml.nvmlDeviceGetComputeRunningProcesses, h1),
            "is_lost_class": isinstance(pynvml.NVMLError(15), pynvml.NVMLError_GpuIsLost),
            "d0_used": pynvml.nvmlDeviceGetMemoryInfo(h0, version=pynvml.nvmlMemory_v2).used,
        })
        """,
        nvml_env(lib_dir, tmp_path / "state"),
    )
    for key in ("memory", "name", "procs"):
        assert out[key] == {"exc": "NVMLError_GpuIsLost", "nvml_error": True, "value": 15}, key
    assert out["is_lost_class"] is True
    assert out["d0_used"] == 10 * GiB


def test_injected_errors(lib_dir: Path, tmp_path: Path) -> None:
    state = two_gpus()
    state.inject_error("nvmlInitWithFlags", 9)
    state.write(tmp_path / "init-fails")
    out = run_script(
        """
        emit({"init": catch(pynvml.nvmlInit), "count": catch(pynvml.nvmlDeviceGetCount)})
        """,
        nvml_env(lib_dir, tmp_path / "init-fails"),
    )
    assert out["init"] == {"exc": "NVMLError_DriverNotLoaded", "nvml_error": True, "value": 9}
    assert out["count"]["exc"] == "NVMLError_Uninitialized"

    state.clear_errors()
    state.inject_error("nvmlDeviceGetMemoryInfo_v2", 3, device=1)
    state.inject_error("nvmlDeviceGetAccountingMode", 4)
    state.write(tmp_path / "per-device")
    out = run_script(
        """
        pynvml.nvmlInit()
        h0, h1 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
        emit({
            "m0": catch(lambda: pynvml.nvmlDeviceGetMemoryInfo(h0, version=pynvml.nvmlMemory_v2).used),
            "m1": catch(pynvml.nvmlDeviceGetMemoryInfo, h1, version=pynvml.nvmlMemory_v2),
            "m1_v1": catch(lambda: pynvml.nvmlDeviceGetMemoryInfo(h1).used),
            "acct0": catch(pynvml.nvmlDeviceGetAccountingMode, h0),
            "acct1": catch(pynvml.nvmlDeviceGetAccountingMode, h1),
        })
        """,
        nvml_env(lib_dir, tmp_path / "per-device"),
    )
    assert out["m0"] == {"ok": 10 * GiB}
    assert out["m1"]["exc"] == "NVMLError_NotSupported"
    assert out["m1_v1"] == {"ok": 1 * GiB}
    assert out["acct0"]["exc"] == out["acct1"]["exc"] == "NVMLError_NoPermission"


def test_error_string_and_struct_version(lib_dir: Path, tmp_path: Path) -> None:
    """pynvml asks the library for messages it has no text for (e.g. 25); a wrong struct version is refused."""
    two_gpus().write(tmp_path / "state")
    out = run_script(
        """
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        r = catch(pynvml.nvmlDeviceGetMemoryInfo, h, version=0x01000028)
        try:
            pynvml.nvmlDeviceGetMemoryInfo(h, version=0x01000028)
        except pynvml.NVMLError as exc:
            r["text"] = str(exc)
        r["direct"] = pynvml.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST)
        emit(r)
        """,
        nvml_env(lib_dir, tmp_path / "state"),
    )
    assert out["exc"] == "NVMLError_ArgumentVersionMismatch"
    assert out["text"] == "The provided version is invalid/unsupported"
    assert out["direct"] == "GPU is lost"


def test_library_not_found(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run_script(
        """
        import ctypes
        try:
            ctypes.CDLL("libnvidia-ml.so.1")
            emit({"system_nvml": True})
        except OSError:
            emit({"system_nvml": False, "init": catch(pynvml.nvmlInit)})
        """,
        nvml_env(empty, tmp_path / "state"),
    )
    if out["system_nvml"]:
        pytest.skip("this machine has a real libnvidia-ml.so.1 on the loader's path")
    assert out["init"] == {"exc": "NVMLError_LibraryNotFound", "nvml_error": True, "value": 12}


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
