"""The watched set as it is saved across restarts, and how it is taken back at start.

What is kept per entry (:class:`Saved`) is what a restarted daemon cannot learn again from
the kernel: who was watched and why (label, children-following), the peak window
(``peak_since``, the agent-side reset's ``hwm_at_reset``) and the last known peaks (RSS,
and GPU memory as one figure); for an exited process, everything it will ever be shown
with. A live process's GPU peak starts again from the driver's figures after a restart. The history is not kept.

Identity is ``(pid, starttime)``, as in the registry: a saved live process is taken back
only when its PID's start time is still the saved one. Otherwise it ended while the daemon
was down (its PID free, or another process's now): it is listed as exited with its last
known peak, not exact (it may have grown after the last save). A reused PID is never taken
for it.

Children-following cannot keep the rights of the client that asked for it (that client is
gone): a restored follower follows only children of its own UID, whoever attached it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from memproto.text import label_problem, printable
from memproto.units import format_size

from ..errors import MemagentError
from ..proc.lifecycle import GoneHandle
from .registry import Registry
from .watched import Watched

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Saved:
    """One entry of the saved state; times are Unix seconds, ``starttime`` clock ticks."""

    pid: int
    starttime: int
    start_time: float
    attached_at: float
    name: str
    cmdline: list[str]
    uid: int
    label: str | None
    label_trusted: bool
    follow_children: bool
    alive: bool
    exited_at: float | None
    peak: int
    peak_exact: bool
    peak_since: float
    hwm_at_reset: int | None
    #: GPU memory peak, all GPUs together (None: unknown; absent from files before it).
    vram_peak: int | None = None
    #: Its own ``oom_score_adj`` before this daemon wrote its label's (memagent.core.oom);
    #: None: not written. After a crash the value found is the daemon's, not the original.
    oom_original: int | None = None

    @classmethod
    def of(cls, w: Watched) -> Saved:
        return cls(w.pid, w.key[1], w.start_time, w.attached_at, w.name, list(w.cmdline), w.uid, w.label,
                   w.label_trusted, w.follow_children, w.alive, w.exited_at, w.peak, w.peak_known_exact,
                   w.peak_since, w.hwm_at_reset, w.vram_peak, w.oom_original if w.alive else None)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: object) -> Saved:
        """Checked field by field: ValueError names the first wrong one (a file someone
        edited, or another version's, is refused whole rather than half-restored)."""
        if not isinstance(data, dict):
            raise ValueError("an entry is not an object")
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            v = data.get(f.name)
            if not _fits(v, str(f.type)):
                raise ValueError(f"entry field {f.name}: {v!r:.60}")
            values[f.name] = v
        if values["pid"] <= 0 or values["starttime"] < 0 or values["peak"] < 0:
            raise ValueError("entry: a negative PID, start time or peak")
        if values["label"] is not None and label_problem(values["label"]) is not None:
            raise ValueError("entry: an invalid label")
        return cls(**values)


def _fits(v: object, annotation: str) -> bool:
    if v is None:
        return annotation.endswith("| None")
    kind = annotation.removesuffix(" | None")
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "float":
        return isinstance(v, int | float) and not isinstance(v, bool)
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "str":
        return isinstance(v, str)
    return isinstance(v, list) and all(isinstance(x, str) for x in v)  # list[str]


def same_uid(uid: int) -> Any:
    """The rights a restored follower follows children with: its own UID's (module doc)."""
    return lambda child_uid: child_uid == uid


def restore(registry: Registry, saved: list[Saved], now: float) -> tuple[int, int]:
    """Take ``saved`` back into ``registry``: (re-attached, listed as exited)."""
    back = gone = 0
    for s in saved:
        if s.alive and _reattach(registry, s):
            back += 1
        elif (s.pid, s.starttime) not in registry.entries:
            _add_exited(registry, s, now)
            gone += 1
    return back, gone


def _reattach(registry: Registry, s: Saved) -> bool:
    """Whether the process with this identity was there and is watched again."""
    try:
        if registry.procfs.stat(s.pid).starttime != s.starttime:
            return False  # its PID is another process's now
        w = registry.attach(s.pid, label=s.label, children=s.follow_children, may_watch=same_uid(s.uid))[0]
    except MemagentError as exc:
        log.debug("saved %d not re-attached: %s", s.pid, exc)
        return False
    if w.key != (s.pid, s.starttime):  # reused between the check and the open: not ours
        registry.detach(s.pid)
        return False
    w.label_trusted = s.label_trusted
    w.attached_at = s.attached_at
    # The same process (its start time checked, its directory pinned): its own value is the
    # saved one, whatever a daemon that did not stop cleanly left there. Judged at the next tick.
    w.oom_original = s.oom_original
    w.keep_window(s.peak_since, s.hwm_at_reset, s.peak)
    log.info("restored %d (%s), peak %s since %s", s.pid, printable(s.label or s.name), format_size(w.peak, long=True),
             time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.peak_since)))
    return True


def _add_exited(registry: Registry, s: Saved, now: float) -> None:
    """An exited entry with the saved figures; exact only if it exited exact (a process
    that ended while the daemon was down may have grown after the last save)."""
    w = Watched(GoneHandle(s.pid, s.starttime), start_time=s.start_time, name=s.name, cmdline=list(s.cmdline),
                uid=s.uid, label=s.label, attached_at=s.attached_at, history=registry.new_history())
    w.label_trusted = s.label_trusted
    w.follow_children = s.follow_children
    w.peak_since = s.peak_since
    w.hwm = w.sampled_max = s.peak
    if s.vram_peak is not None:  # one figure for all its GPUs, sampled as far as we know now
        w.vram_peaks = {-1: [s.vram_peak, False]}
    if s.alive:
        log.info("%d (%s) ended while the daemon was down; last known peak %s", s.pid,
                 printable(s.label or s.name), format_size(s.peak, long=True))
    elif s.peak_exact:
        w.exit_hwm = s.peak
    w.mark_exited(now if s.alive or s.exited_at is None else s.exited_at)
    registry.insert_exited(w)
