"""GPU memory on Jetson boards with the nvgpu driver (Orin class), from nvmap's debugfs.

There NVML gives no per-process figures (Thor-class boards use the unified ``nvidia``
driver, where NVML works). The nvmap driver lists, per client, the memory each process
has mapped through the GPU's IOMMU: ``/sys/kernel/debug/nvmap/iovmm/clients``, root only
(debugfs), parsed by :func:`~memagent.proc.parse.parse_nvmap_clients`. That is the figure
jtop shows. It is a sampled figure (no high-water mark): each process's peak is the
maximum seen at the ticks, never exact.

:class:`NvmapSource` has the shape of :class:`~memagent.proc.nvml.Nvml` that
:class:`memagent.core.gpu.GpuSampler` uses (``available``, ``note``, ``start``, ``read``,
``accounting_max``, ``close``): one device, index 0, the board's unified memory. A read
that fails (the file gone, unreadable, not the format) marks that tick's figures unknown
(``failed``), as a GPU whose process list could not be read; it is tried again next tick.
"""

from __future__ import annotations

import logging

from .nvml import DeviceReading, GpuReading
from .parse import parse_nvmap_clients

log = logging.getLogger(__name__)

#: Where the nvgpu driver's nvmap lists its clients (``[gpu] nvmap_clients``).
NVMAP_CLIENTS = "/sys/kernel/debug/nvmap/iovmm/clients"
#: The one device's name and UUID on the wire (it has no NVML UUID).
NAME = "Jetson GPU (nvmap, unified memory)"
UUID = "nvmap"
#: Bounds a read (the file has a row per client: some KiB).
MAX_BYTES = 1 << 20


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(MAX_BYTES)


class NvmapSource:
    def __init__(self, path: str = NVMAP_CLIENTS) -> None:
        self.path = path
        self.available = False
        self.note: str | None = "not started"
        self._last_used: int | None = None
        self._warned = False

    def start(self) -> None:
        """Available when the file can be read and has the clients header."""
        try:
            parse_nvmap_clients(_read(self.path))
        except FileNotFoundError:
            self.note = f"{self.path} not found (not a Jetson with the nvgpu driver, or debugfs not mounted)"
        except PermissionError:
            self.note = f"{self.path}: permission denied (debugfs is root's)"
        except OSError as exc:
            self.note = f"{self.path}: {exc.strerror or exc}"
        except ValueError as exc:
            self.note = f"{self.path}: not nvmap's clients file ({exc})"
        else:
            self.available, self.note = True, None

    def read(self) -> GpuReading:
        try:
            usage, total, skipped = parse_nvmap_clients(_read(self.path))
        except (OSError, ValueError) as exc:
            if not self._warned:
                log.warning("nvmap clients file %s unreadable (%s): GPU memory unknown until it reads again",
                            self.path, exc)
                self._warned = True
            return GpuReading([self._device(None)], {}, {0})
        if skipped and not self._warned:
            log.warning("nvmap clients file %s: %d rows that do not parse, skipped", self.path, skipped)
            self._warned = True
        self._last_used = total if total is not None else sum(usage.values())
        return GpuReading([self._device(self._last_used)], {pid: [(0, used)] for pid, used in usage.items()})

    def _device(self, used: int | None) -> DeviceReading:
        # Total: the unified pool is the host's RAM, counted in the host's headroom
        # (docs/gpu.md, "Jetson"); no GPU headroom of its own.
        return DeviceReading(0, NAME, UUID, None, used, False, False, unified=True)

    def accounting_max(self, index: int, pid: int) -> int | None:
        return None  # nvmap keeps no high-water mark

    def close(self) -> None:
        self.available = False
