"""GPU memory through NVML (``nvidia-ml-py``, imported as ``pynvml``).

One :class:`Nvml` per agent. :meth:`Nvml.read` is called once per tick and makes a
fixed number of NVML calls per *device* (memory, compute and graphics process lists),
whatever the number of processes; the driver's per-process high-water mark
(accounting stats) is asked only for watched processes, and only when asked for.

What can go wrong is handled here and becomes data, never an exception upstream:

- no NVIDIA library, driver not loaded, no device: ``available`` is False and ``note``
  says why, logged once; nothing is retried.
- ``pynvml``'s unversioned process-list calls use the ``_v3`` symbols only and raise
  ``NVMLLibraryMismatchError`` (not an ``NVMLError``) on a driver without them: we fall
  back to ``_v2`` and remember it per device. Memory info: ``_v2`` (v1 counts reserved
  memory as used on R510+ drivers), falling back to v1 where ``_v2`` is missing.
- ``usedGpuMemory`` may be ``None`` (the driver does not know): kept as ``None``.
- a GPU that falls off the bus (``GpuIsLost``) is marked lost; other GPUs go on.

NVML reports host PIDs: the agent must run in the host PID namespace (as nvidia-smi
needs ``--pid=host`` in a container). :func:`in_host_pid_namespace` tells.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

#: Reads between two looks at each GPU's accounting mode (~1 min at 0.5 s).
ACCOUNTING_REFRESH_READS = 120


@dataclass(frozen=True, slots=True)
class DeviceReading:
    index: int
    name: str
    uuid: str
    total: int | None
    used: int | None
    lost: bool
    accounting: bool
    #: Its memory is the host's RAM (a Jetson's, read through nvmap): counted in the host's
    #: headroom, no headroom of its own (memagent.alerting.headroom).
    unified: bool = False


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One tick's view of every GPU."""

    devices: list[DeviceReading]
    #: pid -> [(device index, used bytes or None)], a process on several GPUs has several.
    usage: dict[int, list[tuple[int, int | None]]] = field(default_factory=dict)
    #: Devices whose process list could not be read this tick (their figures are unknown).
    failed: set[int] = field(default_factory=set)


def in_host_pid_namespace(proc: str = "/proc") -> bool:
    """False when this process visibly lives in a nested PID namespace: ``NSpid`` lists
    more than one PID (a /proc of an outer namespace), or our namespace is not PID 1's.

    A container that mounts its own /proc hides both; for that case the agent also checks
    at run time that the PIDs NVML reports exist here (:func:`pids_unmatched`).
    """
    try:
        with open(os.path.join(proc, "self", "status")) as f:
            for line in f:
                if line.startswith("NSpid:") and len(line.split()) > 2:
                    return False
        return os.readlink(os.path.join(proc, "self", "ns", "pid")) == os.readlink(os.path.join(proc, "1", "ns", "pid"))
    except OSError:
        return True  # cannot tell (no permission on /proc/1): assume the usual


def pids_unmatched(pids: Iterable[int], proc: str = "/proc") -> bool:
    """True when NVML reports processes and none of them exists in this PID namespace."""
    pids = list(pids)
    return bool(pids) and not any(os.path.exists(os.path.join(proc, str(p))) for p in pids)


#: Why NVML is unavailable, for people, by the name of ``pynvml``'s error.
_KNOWN_ERRORS = {
    "NVMLError_LibraryNotFound": "NVIDIA library (libnvidia-ml.so.1) not found",
    "NVMLError_DriverNotLoaded": "NVIDIA driver not loaded",
    "NVMLError_NoPermission": "no permission to use the NVIDIA driver",
}
#: The library ``pynvml`` loads on Linux.
NVML_LIBRARY = "libnvidia-ml.so.1"


def _describe(exc: Exception) -> str:
    return _KNOWN_ERRORS.get(type(exc).__name__, f"NVML unavailable: {exc}")


def _library_missing() -> bool:
    """Whether ``pynvml`` would find no NVML library to load (Linux: the loader's own
    search, as ``pynvml`` does it). Told before ``import pynvml``, which takes 10 ms (most
    of an agent's start where there is no GPU: ``memagent run``'s, issue 26) only to fail
    at ``nvmlInit``; elsewhere False (``pynvml`` tells)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        return True
    return False


class _Device:
    __slots__ = ("accounting", "handle", "index", "lost", "memory_v2", "name", "procs_v3", "uuid")

    def __init__(self, index: int, handle: Any, name: str, uuid: str) -> None:
        self.index = index
        self.handle = handle
        self.name = name
        self.uuid = uuid
        self.lost = False
        self.memory_v2 = True
        self.procs_v3 = True
        self.accounting = False


class Nvml:
    def __init__(self) -> None:
        self.available = False
        self.note: str | None = "not started"
        self.devices: list[_Device] = []
        self._nvml: Any = None
        self._reads = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Load and initialise NVML; on any failure, GPU memory is just not available."""
        if _library_missing() and importlib.util.find_spec("pynvml") is not None:
            self._unavailable(_KNOWN_ERRORS["NVMLError_LibraryNotFound"])  # what nvmlInit() would raise
            return
        try:
            import pynvml
        except ImportError:
            self._unavailable("nvidia-ml-py is not installed")
            return
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self._unavailable(_describe(exc))
            return
        try:
            count = pynvml.nvmlDeviceGetCount()
            for i in range(count):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                self.devices.append(_Device(i, handle, self._text(pynvml.nvmlDeviceGetName, handle),
                                            self._text(pynvml.nvmlDeviceGetUUID, handle)))
        except pynvml.NVMLError as exc:
            self._unavailable(_describe(exc))
            self.close()
            return
        if not self.devices:
            self._unavailable("no NVIDIA GPU found")
            self.close()
            return
        self.available = True
        self.note = None
        self._refresh_accounting()
        log.info("GPU memory from NVML: %s", ", ".join(f"{d.index}: {d.name}" for d in self.devices))

    def _text(self, fn: Any, handle: Any) -> str:
        try:
            value = fn(handle)
        except self._nvml.NVMLError_GpuIsLost:
            return "?"
        return value.decode() if isinstance(value, bytes) else str(value)

    def _unavailable(self, note: str) -> None:
        self.available = False
        self.note = note
        log.info("GPU memory not available: %s", note)

    def close(self) -> None:
        if self._nvml is not None and (self.available or self.devices):
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
        self.available = False

    # ------------------------------------------------------------------ per tick

    def _refresh_accounting(self) -> None:
        for d in self.devices:
            if d.lost:
                continue
            try:
                d.accounting = self._nvml.nvmlDeviceGetAccountingMode(d.handle) == self._nvml.NVML_FEATURE_ENABLED
            except self._nvml.NVMLError_GpuIsLost:
                self._mark_lost(d)
            except self._nvml.NVMLError:
                d.accounting = False  # not supported on this device

    def _mark_lost(self, d: _Device) -> None:
        if not d.lost:
            d.lost = True
            log.warning("GPU %d (%s, %s) is lost; the other GPUs are still sampled", d.index, d.name, d.uuid)

    def _memory(self, d: _Device) -> tuple[int | None, int | None]:
        nv = self._nvml
        if d.memory_v2:
            try:
                m = nv.nvmlDeviceGetMemoryInfo(d.handle, version=nv.nvmlMemory_v2)
                return int(m.total), int(m.used)
            except nv.NVMLError_FunctionNotFound:
                d.memory_v2 = False
        m = nv.nvmlDeviceGetMemoryInfo(d.handle)
        return int(m.total), int(m.used)

    def _process_list(self, d: _Device, kind: str) -> list[Any]:
        nv = self._nvml
        if d.procs_v3:
            try:
                return list(getattr(nv, f"nvmlDeviceGet{kind}RunningProcesses")(d.handle))
            except (nv.NVMLLibraryMismatchError, nv.NVMLError_FunctionNotFound):
                d.procs_v3 = False
                log.info("GPU %d: the driver lacks the _v3 process calls; using _v2", d.index)
        try:
            return list(getattr(nv, f"nvmlDeviceGet{kind}RunningProcesses_v2")(d.handle))
        except nv.NVMLError_FunctionNotFound:
            return []

    def read(self) -> GpuReading:
        """Every device's memory and the processes on it; never raises for NVML errors."""
        nv = self._nvml
        devices: list[DeviceReading] = []
        usage: dict[int, list[tuple[int, int | None]]] = {}
        failed: set[int] = set()
        self._reads += 1
        if self._reads % ACCOUNTING_REFRESH_READS == 0:
            self._refresh_accounting()  # an operator may turn accounting on while we run
        for d in self.devices:
            total = used = None
            if not d.lost:
                try:
                    total, used = self._memory(d)
                    per_pid: dict[int, int | None] = {}
                    for kind in ("Compute", "Graphics"):
                        for p in self._process_list(d, kind):
                            # A process with compute and graphics contexts is listed twice,
                            # with the same memory: count it once.
                            mem = p.usedGpuMemory
                            old = per_pid.get(p.pid, 0)
                            per_pid[p.pid] = None if mem is None or old is None else max(old, int(mem))
                    for pid, mem in per_pid.items():
                        usage.setdefault(pid, []).append((d.index, mem))
                except nv.NVMLError_GpuIsLost:
                    self._mark_lost(d)
                except nv.NVMLError as exc:
                    failed.add(d.index)
                    log.debug("GPU %d: %s", d.index, exc)
            devices.append(DeviceReading(d.index, d.name, d.uuid, total, used, d.lost, d.accounting))
        return GpuReading(devices, usage, failed)

    def accounting_max(self, index: int, pid: int) -> int | None:
        """The driver's high-water mark of ``pid`` on GPU ``index``, where accounting is on."""
        d = self.devices[index]
        if d.lost or not d.accounting:
            return None
        nv = self._nvml
        try:
            stats = nv.nvmlDeviceGetAccountingStats(d.handle, pid)
        except nv.NVMLError_GpuIsLost:
            self._mark_lost(d)
            return None
        except nv.NVMLError:
            return None  # not found (yet), or not supported
        value = int(stats.maxMemoryUsage)
        return None if value >= 0xFFFFFFFFFFFFFFFF else value
