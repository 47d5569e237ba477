"""Would it fit here? The judgement of ``memagent admit`` and ``memagent run --fits``.

A newcomer (a command just run, or peaks given by hand) *fits* a resource when its peak
there plus the Σ peaks the daemon already counts stays within that resource's capacity:
the daemon's own headroom model (docs/headroom.md), asked over the wire, so the answer is
the one ``memagent status`` and the headroom alert would give once the newcomer runs. The
host is always judged; a GPU when the newcomer uses one. A resource the daemon has no
figure for (a GPU it cannot see) cannot be judged, and a gate that cannot judge refuses.

Two bounds (docs/headroom.md, "Two bounds"): the *worst case* adds the newcomer's peak to
Σ peaks (every watched peak at once); the *observed* adds it to the highest total the
daemon saw together (``observed_sum_max_bytes``, never more than that Σ peaks). Both are
answered; the exit status follows the worst case unless ``--basis observed``.

Pure: the daemon's :class:`~memproto.records.Headroom` list comes in, verdicts go out
(:func:`admission`: ``memagent admit``'s, from the daemon's status).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from memproto.records import Contributor, DaemonStatus, Headroom
from memproto.text import printable

from ..errors import CommandFailed
from ..prose import human_bytes
from . import OBSERVED, WORST_CASE

HOST = "host"
#: ``memagent admit``'s ``--json`` code when the daemon cannot tell (a GPU it does not see).
CANNOT_TELL = "cannot-tell"


@dataclass(frozen=True, slots=True)
class Need:
    """The newcomer's peak on one resource (``host`` or a GPU's UUID)."""

    resource: str
    bytes: int


@dataclass(frozen=True, slots=True)
class FitVerdict:
    """One resource judged. ``capacity_bytes`` None: the daemon has no figure for it."""

    resource: str
    name: str
    need_bytes: int
    capacity_bytes: int | None
    #: Σ peaks the daemon counts there now (the newcomer's own processes taken out).
    watched_bytes: int
    top: list[Contributor] = field(default_factory=list)
    #: The highest total the daemon saw together there, at most ``watched_bytes`` (None: it
    #: has no such figure: an older daemon). In an :meth:`observed` verdict, ``watched_bytes`` is it.
    observed_bytes: int | None = None
    basis: str = WORST_CASE

    def observed(self) -> FitVerdict:
        """This need judged against the observed bound instead of Σ peaks; its capacity is
        None (cannot tell) where the daemon has no observed figure."""
        if self.observed_bytes is None:
            return replace(self, capacity_bytes=None, watched_bytes=0, basis=OBSERVED)
        return replace(self, watched_bytes=self.observed_bytes, basis=OBSERVED)

    @property
    def total_bytes(self) -> int:
        return self.watched_bytes + self.need_bytes

    @property
    def fits(self) -> bool:
        return self.capacity_bytes is not None and self.total_bytes <= self.capacity_bytes

    @property
    def over_bytes(self) -> int:
        """By how much it would not fit (0 when it fits)."""
        return 0 if self.capacity_bytes is None else max(0, self.total_bytes - self.capacity_bytes)

    def line(self) -> str:
        """One line for people: the figures and, when it does not fit, by how much."""
        if self.capacity_bytes is None:
            return f"{printable(self.name)}: cannot tell (the daemon has no figure for it)"
        verdict = "fits" if self.fits else f"does NOT fit: {human_bytes(self.over_bytes)} over"
        spare = self.capacity_bytes - self.total_bytes
        tail = f", {human_bytes(spare)} to spare" if self.fits else ""
        what = "seen together" if self.basis == OBSERVED else "Σ peaks"
        return (f"{printable(self.name)}: {human_bytes(self.need_bytes)} + {what} {human_bytes(self.watched_bytes)}"
                f" watched = {human_bytes(self.total_bytes)} of {human_bytes(self.capacity_bytes)}: {verdict}{tail}")

    def heaviest(self, n: int = 3) -> str:
        """The watched processes that weigh most there."""
        return ", ".join(f"PID {c.pid} {printable(c.label)} {human_bytes(c.peak_bytes)}" for c in self.top[:n])

    def to_json(self) -> dict[str, Any]:
        """A worst-case verdict's object (the observed figure beside it); an observed one's
        has ``watched_observed_bytes`` where the other has ``watched_sum_peaks_bytes``."""
        watched = "watched_observed_bytes" if self.basis == OBSERVED else "watched_sum_peaks_bytes"
        out: dict[str, Any] = {
            "resource": self.resource, "name": self.name, "fits": self.fits, "need_bytes": self.need_bytes,
            watched: self.watched_bytes, "capacity_bytes": self.capacity_bytes,
            "total_bytes": self.total_bytes, "over_by_bytes": self.over_bytes,
            "top": [{"pid": c.pid, "label": c.label, "peak_bytes": c.peak_bytes} for c in self.top]}
        if self.basis == WORST_CASE:
            out["observed_sum_max_bytes"] = self.observed_bytes
        return out


def bounds_json(judged: list[FitVerdict], decide: list[FitVerdict]) -> dict[str, Any]:
    """``--json``'s ``worst_case`` and ``observed`` verdicts: each ``{"fits", "resources"}``,
    ``fits`` over the verdicts that decide (``decide``: the host and the GPU chosen)."""
    deciding = {v.resource for v in decide}
    observed = [v.observed() for v in judged]
    return {"worst_case": {"fits": all(v.fits for v in judged if v.resource in deciding),
                           "resources": [v.to_json() for v in judged]},
            "observed": {"fits": all(v.fits for v in observed if v.resource in deciding),
                         "resources": [v.to_json() for v in observed]}}


def decides(verdicts: list[FitVerdict], basis: str) -> bool:
    """Whether it fits on ``basis`` (:data:`WORST_CASE` or :data:`OBSERVED`)."""
    return all((v.observed() if basis == OBSERVED else v).fits for v in verdicts)


def judge(needs: list[Need], headroom: list[Headroom], own: dict[str, int] | None = None) -> list[FitVerdict]:
    """Each need against the daemon's headroom of its resource. ``own``: per resource,
    what the daemon already counts of the newcomer itself (a run's processes the daemon
    happens to watch too), taken out of its Σ so that nothing counts twice."""
    by_resource = {h.resource: h for h in headroom}
    out = []
    for need in needs:
        h = by_resource.get(need.resource)
        if h is None:
            out.append(FitVerdict(need.resource, need.resource, need.bytes, None, 0))
            continue
        watched = max(0, h.sum_peaks_bytes - (own or {}).get(need.resource, 0))
        # Others' total together never exceeded their Σ peaks: the observed figure is capped
        # there (a process detached since, or the newcomer's own, leaves Σ peaks).
        observed = min(h.observed_sum_max_bytes, watched) if h.observed_sum_max_bytes is not None else None
        out.append(FitVerdict(h.resource, h.name, need.bytes, h.capacity_bytes, watched, list(h.top), observed))
    return out


def gpu_uuid(status: DaemonStatus, which: str) -> str | None:
    """A GPU named by index (``0``) or UUID, as the daemon lists it; None: no such GPU."""
    for g in status.gpus:
        if which == g.uuid or (which.isdigit() and int(which) == g.index):
            return g.uuid
    return None


def best_gpu(vram: int, status: DaemonStatus) -> list[FitVerdict]:
    """``vram`` judged on each GPU the daemon sees, the roomiest first: it fits when it
    fits on one of them."""
    verdicts = judge([Need(g.uuid, vram) for g in status.gpus if not g.lost], status.headroom)
    return sorted(verdicts, key=lambda v: -((v.capacity_bytes or 0) - v.total_bytes))


def summary(verdicts: list[FitVerdict]) -> list[str]:
    """Each resource's line, and who weighs most where it does not fit."""
    lines = []
    for v in verdicts:
        lines.append(v.line())
        if not v.fits and v.top:
            lines.append(f"  heaviest watched there: {v.heaviest()}")
    return lines


def admission(status: DaemonStatus, rss: int, vram: int | None,
              gpu: str | None) -> tuple[list[FitVerdict], list[FitVerdict], str | None]:
    """``memagent admit``'s judgement: every verdict (the host; the GPU ``gpu`` names, else
    each GPU, the roomiest first), the ones that decide (the host and the GPU chosen), and
    that GPU's UUID. :class:`CommandFailed` (:data:`CANNOT_TELL`) when a resource has no figure."""
    judged, chosen = _verdicts(status, rss, vram, gpu)
    unknown = [v for v in judged if v.capacity_bytes is None]
    if unknown:
        raise CommandFailed(CANNOT_TELL, unknown[0].line())
    return judged, [v for v in judged if v.resource in (HOST, chosen)], chosen


def _verdicts(status: DaemonStatus, rss: int, vram: int | None, gpu: str | None) -> tuple[list[FitVerdict], str | None]:
    """Host, and the GPU (the one asked for, else the roomiest); the GPU chosen."""
    host = judge([Need(HOST, rss)], status.headroom)
    if vram is None:
        return host, None
    if gpu is not None:
        uuid = gpu_uuid(status, gpu)
        if uuid is None:
            seen = ", ".join(f"{g.index} {g.uuid}" for g in status.gpus) or "none"
            raise CommandFailed(CANNOT_TELL, f"the daemon sees no GPU {printable(gpu)} (it sees: {seen})")
        return host + judge([Need(uuid, vram)], status.headroom), uuid
    gpus = best_gpu(vram, status)
    if not gpus:
        raise CommandFailed(CANNOT_TELL, "the daemon sees no GPU: cannot judge --vram"
                            + (f" ({printable(status.gpu_note)})" if status.gpu_note else ""))
    return host + gpus, gpus[0].resource
