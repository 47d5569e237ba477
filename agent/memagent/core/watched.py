"""The state kept for one watched process, and how its peak is defined.

Peak RSS is ``max(VmHWM, every RSS sampled)`` over the peak window. ``VmHWM`` is the
kernel's own high-water mark: it catches a spike that rose and fell between two ticks.
It lives only in ``/proc/PID/status`` (~10-13 µs to read and parse, see ``bench/``), so
the sampler reads status when ``statm`` changed since the last tick, and otherwise at
least every ``status_every`` ticks; the reported peak is never lower than a value sampled.

``reset-peaks`` starts a new window on the agent's side only: it keeps VmHWM's value at
that moment (``hwm_at_reset``) and the sampled maximum restarts. The window's peak is then
the maximum of samples (``rss_peak_exact`` false) until VmHWM rises above
``hwm_at_reset``: that maximum was reached after the reset, so VmHWM is the window's exact
peak again. The target itself is untouched. ``reset-peaks --kernel`` writes ``5`` to
``/proc/PID/clear_refs`` (the kernel resets VmHWM to the current RSS, and with it the
target's own ``getrusage().ru_maxrss``): the peak is exact at once.

A process that exits may have grown after the last VmHWM read. The kernel's exit record
(taskstats, :mod:`memagent.core.process_events`) carries its final VmHWM: with it the peak
of an exited process is exact; without it (no netlink, or the record lost) it is not
(``rss_peak_exact`` false), however recent the last read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from memproto.records import SAMPLE_COLUMNS, Container, GpuUse, ProcessInfo, ProcessRef
from memproto.series import PeakSeries
from memproto.text import display_name

from ..proc.cgroup_identity import CgroupIdentity, cgroup_path
from ..proc.procfs import PAGE_SIZE, ProcessHandle

#: The wire's field names (:class:`memproto.records.ProcessInfo` and the sample row,
#: declared once in :mod:`memproto.records`) that :class:`Watched` keeps under another
#: name; every other field has the same name on both sides.
ATTRIBUTE_OF = {
    "rss_bytes": "rss",
    "rss_peak_bytes": "peak",
    "anon_bytes": "anon",
    "swap_bytes": "swap",
    "rss_peak_exact": "peak_known_exact",
    "vram_bytes": "vram",
    "vram_peak_bytes": "vram_peak",
    "gpus": "vram_gpus",
    "cgroup": "cgroup_path",
}
#: The sample-frame row of a process, in :data:`memproto.records.SAMPLE_COLUMNS` order.
_row_of = attrgetter(*(ATTRIBUTE_OF.get(column, column) for column in SAMPLE_COLUMNS))
_INFO_FIELDS = tuple((f.name, ATTRIBUTE_OF.get(f.name, f.name)) for f in dataclasses.fields(ProcessInfo))


class Watched:
    """A watched process; mutable, owned by the sampler's event loop."""

    __slots__ = (
        "alive",
        "anon",
        "attached_at",
        "cgroup",
        "cmdline",
        "container",
        "exit_hwm",
        "exit_signal",
        "exited_at",
        "follow_children",
        "follow_may_watch",
        "handle",
        "history",
        "hwm",
        "hwm_at_reset",
        "identity",
        "label",
        "label_trusted",
        "last_statm",
        "memory_reader",
        "name",
        "next_read",
        "ns_pid",
        "oom_count",
        "oom_original",
        "oom_refused",
        "oom_score_adj",
        "peak_since",
        "pid",
        "pre_exec",
        "quiet",
        "row",
        "rss",
        "sampled_max",
        "share_known",
        "shared",
        "shared_resident",
        "stack_state",
        "start_time",
        "statm_fd",
        "status_due",
        "status_fd",
        "status_head",
        "swap",
        "uid",
        "unit",
        "vram",
        "vram_gpus",
        "vram_peaks",
        "vram_sampled_only",
    )

    def __init__(
        self,
        handle: ProcessHandle,
        *,
        start_time: float,
        name: str,
        cmdline: list[str],
        uid: int,
        label: str | None,
        attached_at: float,
        history: PeakSeries,
    ) -> None:
        self.handle = handle
        self.pid = handle.pid
        self.start_time = start_time
        self.name = name
        self.cmdline = cmdline
        self.label = label
        #: False when the label came from a client that does not see everything: it names
        #: that client's own processes, and the operator's label budgets do not count it.
        self.label_trusted = True
        #: The unprivileged UID that may read its memory (its stacks), None: root only
        #: (see memagent.proc.procfs.MemoryAccess); refreshed when a client asks.
        self.memory_reader: int | None = None
        self.uid = uid
        self.alive = True
        self.attached_at = attached_at
        self.exited_at: float | None = None
        self.rss = self.anon = self.swap = 0
        self.hwm = 0
        self.sampled_max = 0
        #: VmHWM when the window restarted on the agent's side (reset-peaks without
        #: --kernel); None: VmHWM covers the window (from start, or a kernel reset).
        self.hwm_at_reset: int | None = None
        self.peak_since = start_time
        self.last_statm = b""
        self.status_due = 0
        #: The ``Name:`` line of its last status read (b"": none yet): a change says it ran
        #: a new program, or renamed itself (memagent.core.sampler).
        self.status_head = b""
        #: Ticks its statm has not changed, and the tick it is read next when idle (see
        #: memagent.core.sampler.IDLE_READ_S; 0: every tick).
        self.quiet = 0
        self.next_read = 0
        self.follow_children = False
        #: The rights of the client that asked to follow children: later children are
        #: attached only if that client could have attached them itself.
        self.follow_may_watch: Callable[[int], bool] | None = None
        self.history = history
        self.row: tuple[object, ...] = ()
        #: GPU memory: None until NVML reports (or when it cannot), see :meth:`set_vram`.
        self.vram: int | None = None
        self.vram_gpus: list[GpuUse] = []
        #: Per GPU index: [peak bytes, exact (from the driver's accounting)].
        self.vram_peaks: dict[int, list[Any]] = {}
        self.vram_sampled_only = False
        #: Where reading this process's Python stack stands (memproto.vocabulary.StackState).
        self.stack_state: str | None = None
        #: RSS - PSS from the last smaps_rollup read (0 until read): resident memory shared
        #: with other processes beyond its fair share (see memagent.alerting.headroom);
        #: when it is read: memagent.alerting.sharing.
        self.shared = 0
        self.share_known = False
        #: Resident memory it shares with any process at that read (``Shared_*``): once it
        #: has exited while a partner lives on, all of that is the partner's to count.
        self.shared_resident = 0
        #: Its memory cgroup (for the cgroup limit and the OOM-kill counter), or None.
        self.cgroup: str | None = None
        #: What its cgroup path says (memagent.proc.cgroup_identity): its unit, its
        #: container (whose name may come later: memagent.core.containers).
        self.identity = CgroupIdentity()
        self.unit: str | None = None
        self.container: Container | None = None
        #: Its PID inside its own PID namespace when nested (a container), else None.
        self.ns_pid: int | None = None
        #: Its cgroup's oom_kill counter when last read; the signal that ended it.
        self.oom_count: int | None = None
        self.exit_signal: int | None = None
        #: The ``oom_score_adj`` this daemon wrote (memagent.core.oom; None: not set by it),
        #: the process's own value before that (given back at detach and a clean stop), and
        #: and why its label's entry, lower than its own, was not written: "rule" (docs/
        #: security.md §15) or "kernel" (no CAP_SYS_RESOURCE); None: nothing refused.
        self.oom_score_adj: int | None = None
        self.oom_original: int | None = None
        self.oom_refused: str | None = None
        #: The kernel's final VmHWM from its exit record (taskstats), None until one came.
        self.exit_hwm: int | None = None
        #: Attached at its fork (a followed parent's child), before it ran a program of its
        #: own: until its exec, its memory is its parent's (a copy, or the very same
        #: pages under vfork), which its own peak must not count.
        self.pre_exec = False
        # Raw descriptors for the sampler's hot loop (no wrapper call per read).
        self.statm_fd = handle.statm_fd
        self.status_fd = handle.status_fd

    @property
    def key(self) -> tuple[int, int]:
        """Identity: PID and the kernel's start time of the process (clock ticks after
        boot, kept by its handle); :attr:`start_time` is the same instant in Unix seconds."""
        return (self.pid, self.handle.starttime)

    @property
    def cgroup_path(self) -> str | None:
        """The wire's ``cgroup``: the path as /proc/PID/cgroup shows it."""
        return cgroup_path(self.cgroup)

    def set_identity(self, identity: CgroupIdentity, name: str | None) -> None:
        """Its unit and container, from its cgroup path; ``name``: the container's, if known."""
        self.identity = identity
        self.unit = identity.unit
        runtime, cid = identity.runtime, identity.container_id
        self.container = None if runtime is None or cid is None else Container(runtime, cid, name)

    @property
    def peak_exact(self) -> bool:
        """VmHWM covers the window: no agent-side reset, or VmHWM rose above its value then."""
        return self.hwm_at_reset is None or self.hwm > self.hwm_at_reset

    @property
    def peak(self) -> int:
        return max(self.hwm, self.sampled_max) if self.peak_exact else self.sampled_max

    @property
    def peak_known_exact(self) -> bool:
        """The wire's ``rss_peak_exact``: :attr:`peak_exact`, and for a process that exited,
        the kernel's final VmHWM arrived (:meth:`take_exit_hwm`). Without it the process may
        have grown between the last VmHWM read and its exit, which no /proc read can see."""
        return self.peak_exact and (self.alive or self.exit_hwm is not None)

    def set_memory(self, resident_pages: int, shared_pages: int, hwm: int | None, swap: int | None) -> None:
        self.rss = resident_pages * PAGE_SIZE
        self.anon = max(0, resident_pages - shared_pages) * PAGE_SIZE
        if hwm is not None:
            self.hwm = hwm
        if swap is not None:
            self.swap = swap
        if self.rss > self.sampled_max:
            self.sampled_max = self.rss
        self._build_row()

    def _build_row(self) -> None:
        """The sample-frame row, in :data:`memproto.records.SAMPLE_COLUMNS` order."""
        self.row = _row_of(self)

    def refresh_row(self) -> None:
        """Rebuild the row after a change outside the memory figures (its oom_score_adj)."""
        self._build_row()

    @property
    def vram_peak(self) -> int | None:
        known = [p[0] for p in self.vram_peaks.values() if p[0] is not None]
        if not known:
            return self.vram  # None (unknown) or 0 (known: none held)
        return int(sum(known))

    @property
    def vram_peak_exact(self) -> bool:
        return bool(self.vram_peaks) and all(p[1] for p in self.vram_peaks.values())

    def set_vram(self, gpus: list[GpuUse], exact_peaks: dict[int, int]) -> None:
        """This tick's GPU memory (``gpus`` empty: none held) and, per GPU index, the
        driver's high-water mark where accounting gives one."""
        self.vram_gpus = gpus
        used = [g.used_bytes for g in gpus]
        self.vram = None if any(u is None for u in used) else sum(u for u in used if u is not None)
        for g in gpus:
            peak = self.vram_peaks.setdefault(g.index, [None, False])
            if g.used_bytes is not None and (peak[0] is None or g.used_bytes > peak[0]):
                peak[0] = g.used_bytes
            exact = None if self.vram_sampled_only else exact_peaks.get(g.index)
            if exact is not None:
                peak[0] = max(peak[0] or 0, exact)
                peak[1] = True
        self._build_row()

    def mark_exited(self, now: float) -> None:
        self.alive = False
        self.exited_at = now
        self._build_row()
        self.handle.close()
        self.statm_fd = self.status_fd = -1

    def take_exit_hwm(self, hwm: int) -> None:
        """The kernel's high-water RSS as the process exited (its taskstats exit record);
        it may come before or after the sampler finds the process gone."""
        self.exit_hwm = max(self.exit_hwm or 0, hwm)
        if hwm > self.hwm:
            self.hwm = hwm
        self._build_row()

    def new_image(self, name: str, cmdline: list[str], resident_pages: int, shared_pages: int,
                  hwm: int | None, swap: int | None) -> None:
        """Its first exec since it was attached at its fork (:attr:`pre_exec`): from here
        on the memory is its own; the figures are the new program's, read just now."""
        self.pre_exec = False
        self.name = name
        self.cmdline = cmdline
        self.sampled_max = 0
        self.hwm = 0
        self.set_memory(resident_pages, shared_pages, hwm, swap)
        self.last_statm = b""  # re-read status on the next tick
        self.status_due = 0

    def restart_window(self, now: float, kernel_reset: bool, resident_pages: int, shared_pages: int,
                       hwm: int | None) -> None:
        """A new peak window from values read just now (after clear_refs when
        ``kernel_reset``): the last tick's RSS may be stale, e.g. caught in the middle of a
        spike that is over. Without a kernel reset, VmHWM now is the bar it must pass."""
        self.peak_since = now
        self.sampled_max = 0
        if kernel_reset:
            self.hwm = hwm or 0
            self.hwm_at_reset = None
        else:
            if hwm is not None:
                self.hwm = hwm
            self.hwm_at_reset = self.hwm
        self.set_memory(resident_pages, shared_pages, hwm, None)
        self.last_statm = b""  # re-read status on the next tick
        self.status_due = 0
        # The driver's accounting maximum covers the process's whole life and cannot be
        # reset: from here on the GPU peak is sampled (vram_peak_exact false).
        self.vram_peaks = {g.index: [g.used_bytes, False] for g in self.vram_gpus}
        self.vram_sampled_only = True

    def keep_window(self, since: float, hwm_at_reset: int | None, peak: int) -> None:
        """The peak window saved before the daemon restarted (memagent.core.restore) goes
        on: VmHWM still covers it, unless it was restarted on the agent's side, whose bar
        (``hwm_at_reset``) is kept; and its peak is never below the saved one."""
        self.peak_since = since
        self.hwm_at_reset = hwm_at_reset
        self.sampled_max = max(self.sampled_max, peak)
        self._build_row()

    @property
    def display(self) -> str:
        """How it is named to a person (:func:`memproto.text.display_name`), unescaped."""
        return display_name(self.label, self.name, self.cmdline)

    def info(self) -> ProcessInfo:
        """Everything known, as the wire's :class:`ProcessInfo` (lists copied: the record
        is immutable, this object is not)."""
        values = {name: getattr(self, attr) for name, attr in _INFO_FIELDS}
        values["cmdline"] = list(self.cmdline)
        values["gpus"] = list(self.vram_gpus)
        return ProcessInfo(**values)

    def ref(self) -> ProcessRef:
        return ProcessRef(self.pid, self.start_time)
