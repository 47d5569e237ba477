"""Shared material of the fake-NVML tests: a prelude for the scripts run through the real
pynvml in a fresh interpreter, and a standard two-GPU state.

The fake is built by the session fixtures ``build_lib`` and ``lib_dir`` of ``tests/conftest.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

from fakes.fakenvml import FakeGpuState, GiB

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
