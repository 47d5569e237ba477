"""Build and drive the fake NVIDIA driver library (``fake_nvml.c``) for tests.

The fake is a C shared library named ``libnvidia-ml.so.1`` that the unmodified ``pynvml``
(PyPI ``nvidia-ml-py``) loads through ``LD_LIBRARY_PATH``. What it reports comes from a
small text state file (:class:`FakeGpuState` writes it) that the library re-reads on every
call, so a test can change the GPUs' state while the process under test runs.

``pynvml`` loads the library once per process: run the code under test in a subprocess
whose environment comes from :func:`nvml_env`.

Standard library only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = [
    "FAKE_NVML_SOURCE",
    "NVML_SYMBOLS",
    "FakeDevice",
    "FakeGpuState",
    "FakeProc",
    "GiB",
    "MiB",
    "build_fake_nvml",
    "nvml_env",
]

FAKE_NVML_SOURCE = Path(__file__).resolve().with_name("fake_nvml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"
MAX_DEVICES = 16

MiB = 1024 * 1024
GiB = 1024 * MiB

#: Every symbol the fake exports; each can be left out with ``build_fake_nvml(..., omit=[...])``.
NVML_SYMBOLS: tuple[str, ...] = (
    "nvmlInitWithFlags",
    "nvmlInit_v2",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetAccountingMode",
    "nvmlDeviceGetAccountingStats",
)


def build_fake_nvml(
    out_dir: Path,
    omit: Sequence[str] = (),
    *,
    defines: Mapping[str, str | None] | None = None,
) -> Path:
    """Compile ``fake_nvml.c`` into ``out_dir/libnvidia-ml.so.1`` and return ``out_dir``.

    ``omit``: symbols (from :data:`NVML_SYMBOLS`) to leave out of the library, as a driver
    that lacks them would. ``defines``: extra preprocessor macros, e.g.
    ``{"FAKE_NVML_PROC_V3_CC": None}`` for the 32-byte ``_v3`` process entries of early R535
    drivers. ``out_dir`` is what goes on ``LD_LIBRARY_PATH``.

    Raises ``FileNotFoundError`` when ``gcc`` is not on ``PATH``, ``ValueError`` for an
    unknown symbol and ``subprocess.CalledProcessError`` when the build fails.
    """
    unknown = sorted(set(omit) - set(NVML_SYMBOLS))
    if unknown:
        raise ValueError(f"not a symbol of the fake NVML: {', '.join(unknown)}")
    gcc = shutil.which("gcc")
    if gcc is None:
        raise FileNotFoundError("gcc is not on PATH")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    flags = [f"-DOMIT_{symbol}" for symbol in sorted(set(omit))]
    for name, value in sorted((defines or {}).items()):
        flags.append(f"-D{name}" if value is None else f"-D{name}={value}")
    target = out_dir / LIBRARY_NAME
    tmp = out_dir / f".{LIBRARY_NAME}.{os.getpid()}.tmp"
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", *flags, "-o", str(tmp), str(FAKE_NVML_SOURCE)],
        check=True,
        capture_output=True,
        text=True,
    )
    os.replace(tmp, target)
    return out_dir


def nvml_env(lib_dir: Path, state_file: Path, log: Path | None = None) -> dict[str, str]:
    """A copy of ``os.environ`` for a subprocess that loads the fake from ``lib_dir``.

    ``LD_LIBRARY_PATH`` gets ``lib_dir`` in front, ``FAKE_NVML_STATE`` names ``state_file``
    and, when ``log`` is given, ``FAKE_NVML_LOG`` names the call log (one line per call: the
    symbol); otherwise an inherited ``FAKE_NVML_LOG`` is dropped.
    """
    env = dict(os.environ)
    previous = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = f"{lib_dir}{os.pathsep}{previous}" if previous else str(lib_dir)
    env["FAKE_NVML_STATE"] = str(state_file)
    if log is not None:
        env["FAKE_NVML_LOG"] = str(log)
    else:
        env.pop("FAKE_NVML_LOG", None)
    return env


@dataclass
class FakeDevice:
    """One GPU. ``used`` is what NVML reports as used; free is ``total - used``."""

    index: int
    uuid: str
    name: str
    total: int
    used: int = 0
    accounting: bool = False
    lost: bool = False


@dataclass
class FakeProc:
    """A process on a GPU; ``used`` None is NVML's "not available" (pynvml gives None)."""

    device: int
    pid: int
    used: int | None
    kind: Literal["compute", "graphics"] = "compute"


@dataclass
class FakeGpuState:
    """What the fake driver reports; :meth:`write` it, and write it again to change it live."""

    driver: str = "550.54.15"
    devices: list[FakeDevice] = field(default_factory=list)
    procs: list[FakeProc] = field(default_factory=list)
    #: (device index, pid) -> the accounting high-water mark in bytes (None: not available).
    accounting: dict[tuple[int, int], int | None] = field(default_factory=dict)
    #: (symbol, NVML return code, device index or None for every device)
    errors: list[tuple[str, int, int | None]] = field(default_factory=list)

    def add_device(
        self,
        name: str = "NVIDIA H100 80GB HBM3",
        total: int = 80 * GiB,
        used: int = 0,
        *,
        uuid: str | None = None,
        accounting: bool = False,
        lost: bool = False,
    ) -> FakeDevice:
        """Add the next device (index ``len(devices)``); the UUID is derived from it unless given."""
        index = len(self.devices)
        if index >= MAX_DEVICES:
            raise ValueError(f"the fake NVML has at most {MAX_DEVICES} devices")
        device = FakeDevice(
            index=index,
            uuid=uuid or f"GPU-fa4e0000-0000-4000-8000-{index:012x}",
            name=name,
            total=total,
            used=used,
            accounting=accounting,
            lost=lost,
        )
        self.devices.append(device)
        return device

    def device(self, index: int) -> FakeDevice:
        """The device with this index."""
        for device in self.devices:
            if device.index == index:
                return device
        raise KeyError(index)

    def add_proc(
        self, device: int, pid: int, used: int | None, kind: Literal["compute", "graphics"] = "compute"
    ) -> FakeProc:
        """Put process ``pid`` on ``device`` using ``used`` bytes (None: not available)."""
        proc = FakeProc(device=device, pid=pid, used=used, kind=kind)
        self.procs.append(proc)
        return proc

    def remove_procs(self, pid: int, device: int | None = None) -> None:
        """Take ``pid`` off ``device`` (every device if None)."""
        self.procs = [p for p in self.procs if not (p.pid == pid and (device is None or p.device == device))]

    def set_accounting_max(self, device: int, pid: int, max_bytes: int | None) -> None:
        """Set the accounting high-water mark reported for ``pid`` on ``device``."""
        self.accounting[(device, pid)] = max_bytes

    def inject_error(self, symbol: str, code: int, device: int | None = None) -> None:
        """Make ``symbol`` return NVML code ``code`` (on every device, or only on ``device``)."""
        self.errors.append((symbol, code, device))

    def clear_errors(self) -> None:
        """Remove every injected error."""
        self.errors.clear()

    def render(self) -> str:
        """The state file's text."""
        lines = ["# fake NVML state (tests/fakes/README.md)", f"driver {_word(self.driver)}"]
        for d in sorted(self.devices, key=lambda d: d.index):
            if "\n" in d.name or "\r" in d.name:
                raise ValueError(f"device name {d.name!r} spans lines")
            lines.append(
                f"device {d.index} {_word(d.uuid)} {_uint(d.total)} {_uint(d.used)} "
                f"{int(d.accounting)} {int(d.lost)} {d.name}"
            )
        for p in self.procs:
            used = "na" if p.used is None else str(_uint(p.used))
            lines.append(f"proc {p.device} {p.kind} {_uint(p.pid)} {used}")
        for (acct_device, pid), max_bytes in self.accounting.items():
            lines.append(f"acct {acct_device} {_uint(pid)} {'na' if max_bytes is None else _uint(max_bytes)}")
        for symbol, code, err_device in self.errors:
            lines.append(f"error {_word(symbol)} {_uint(code)}" + ("" if err_device is None else f" {err_device}"))
        return "\n".join(lines) + "\n"

    def write(self, path: Path) -> None:
        """Write the state file atomically (a temporary file in the same directory, then rename)."""
        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(self.render())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _word(value: str) -> str:
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"{value!r} must be one non-empty word")
    return value


def _uint(value: int) -> int:
    if value < 0:
        raise ValueError(f"{value} is negative")
    return value
