"""Each tick's GPU memory: one NVML read per device, then each watched process's share
of it, and its peak (the driver's own high-water mark where accounting mode is on).

The source is chosen at start (:meth:`GpuSampler.start`): nvmap's clients file where it
can be read (a Jetson with the nvgpu driver, whose NVML gives no per-process figures:
:mod:`memagent.proc.nvmap`), else NVML, else none; ``source`` and ``source_note`` say
which and why (``memagent status``).

NVML reports host PIDs: in a nested PID namespace none of them matches a watched
process. That is detected at start (:func:`~memagent.proc.nvml.in_host_pid_namespace`)
and, for a container with its own /proc, at run time; both are logged once.
"""

from __future__ import annotations

import logging
from typing import Protocol

from memproto.records import GpuUse

from ..proc.nvmap import NvmapSource
from ..proc.nvml import DeviceReading, GpuReading, in_host_pid_namespace, pids_unmatched
from .registry import Registry
from .watched import Watched

log = logging.getLogger(__name__)

NESTED_AT_START = ("this agent runs in a nested PID namespace but NVML reports host PIDs: per-process GPU "
                   "memory will not match; run it in the host PID namespace (e.g. docker --pid=host)")
NESTED_AT_RUN_TIME = ("none of the PIDs NVML reports exists here: this agent is not in the host PID namespace, "
                      "so per-process GPU memory cannot be matched (run it with the host's PID namespace, e.g. "
                      "docker --pid=host)")


class GpuSource(Protocol):
    """What the sampler reads GPU memory from: :class:`Nvml` or :class:`NvmapSource`."""

    available: bool
    note: str | None

    def start(self) -> None: ...
    def read(self) -> GpuReading: ...
    def accounting_max(self, index: int, pid: int) -> int | None: ...
    def close(self) -> None: ...


class GpuSampler:
    def __init__(self, registry: Registry, nvml: GpuSource, exact_every: int,
                 nvmap: NvmapSource | None = None) -> None:
        self.registry = registry
        #: The source in use (NVML until start chooses).
        self.nvml = nvml
        #: Jetson's nvmap clients file, tried first at start; None: not tried.
        self.nvmap = nvmap
        #: "nvml", "nvmap" or "none", and why, for humans (DaemonStatus.gpu_source).
        self.source = "none"
        self.source_note: str | None = None
        #: Ticks between forced reads of the driver's per-process peak (as for VmHWM).
        self.exact_every = max(1, exact_every)
        self.devices: list[DeviceReading] = []
        self.host_pid_namespace = in_host_pid_namespace()

    @property
    def available(self) -> bool:
        return self.nvml.available

    def start(self, enabled: bool) -> None:
        if not enabled:
            self.nvml.note = self.source_note = "disabled (--no-gpu)"
            return
        nvmap_note = "not configured ([gpu] nvmap_clients = \"\")"
        if self.nvmap is not None:
            self.nvmap.start()
            if self.nvmap.available:
                self.nvml = self.nvmap
                self.source = "nvmap"
                self.source_note = (f"{self.nvmap.path} readable: a Jetson with the nvgpu driver, where NVML gives "
                                    "no per-process figures; peaks sampled")
                self.devices = self.nvml.read().devices
                log.info("GPU memory from nvmap (%s)", self.nvmap.path)
                return
            nvmap_note = self.nvmap.note or "unavailable"
        self.nvml.start()
        self.source = "nvml" if self.nvml.available else "none"
        why_not_nvml = "" if self.nvml.available else f"NVML: {self.nvml.note}; "
        self.source_note = f"{why_not_nvml}nvmap: {nvmap_note}"
        if self.nvml.available:
            self.devices = self.nvml.read().devices
            if not self.host_pid_namespace:
                log.warning(NESTED_AT_START)

    def sample(self, tick: int) -> list[Watched]:
        """One NVML read per device, then each watched process's share of it; returns the
        processes whose GPU memory changed."""
        reading = self.nvml.read()
        self.devices = reading.devices
        if self.host_pid_namespace and pids_unmatched(reading.usage):
            self.host_pid_namespace = False
            log.warning(NESTED_AT_RUN_TIME)
        uuid = {d.index: d.uuid for d in reading.devices}
        accounting = {d.index for d in reading.devices if d.accounting and not d.lost}
        due = tick % self.exact_every == 0
        changed = []
        for w in self.registry.alive:
            uses = list(reading.usage.get(w.pid, ()))
            before = {g.index: g.used_bytes for g in w.vram_gpus}
            # A GPU whose list failed this tick: what was there is unknown now, not gone.
            uses += [(index, None) for index in reading.failed if index in before]
            exact: dict[int, int] = {}
            for index, used in uses:
                if index in accounting and (due or before.get(index, -1) != used):
                    peak = self.nvml.accounting_max(index, w.pid)
                    if peak is not None:
                        exact[index] = peak
            vram, peak = w.vram, w.vram_peak
            w.set_vram([GpuUse(i, uuid[i], used) for i, used in uses], exact)
            if (w.vram, w.vram_peak) != (vram, peak):
                changed.append(w)
        return changed

    def close(self) -> None:
        self.nvml.close()
