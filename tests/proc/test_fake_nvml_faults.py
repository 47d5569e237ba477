"""The fake NVIDIA driver's failure modes, through the real pynvml: an older driver's missing
symbols, the R535 ``_v3`` stride, a lost GPU, injected errors, error strings, no library.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import BuildFn
from fakes.fakenvml import GiB, MiB, nvml_env
from nvml_probe import NA, run_script, two_gpus


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


@pytest.mark.e2e
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
