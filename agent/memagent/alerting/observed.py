"""The observed bound: the highest total the watched processes reached *at the same
moment*, per headroom resource, beside Σ peaks (the worst case, every peak at once).

The truth lies between the two: Σ peaks is an upper bound (peaks that never meet are
summed), the observed maximum a lower one (two peaks that met between two ticks are not
summed together). Both count the same pages: a moment's total is the headroom view's
``sum_now_bytes`` (:func:`.headroom.now_part`, share-adjusted as Σ peaks is).

One fold, :class:`HighestTogether`, used twice: live by the alert engine on each
evaluation of the headroom (kept across restarts with the state,
:mod:`memagent.store.state`), and over a recorded range by :mod:`memagent.recordings.timeline`
from the daemon's headroom snapshots (:func:`moments_of`), so that the two give the same
figure for the same ticks. Pure.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from memproto.records import Contributor, Headroom


@dataclass(frozen=True, slots=True)
class Together:
    """One moment: the total of the watched processes' memory then, and its largest parts."""

    at: float
    total: int
    top: tuple[Contributor, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "bytes": self.total,
                "top": [{"pid": c.pid, "label": c.label, "bytes": c.peak_bytes} for c in self.top]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Together:
        """The state file's form (:meth:`to_json`); ValueError when it is not that."""
        try:
            top = tuple(Contributor(int(c["pid"]), str(c["label"]), int(c["bytes"])) for c in data.get("top", []))
            at, total = float(data["at"]), int(data["bytes"])
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not an observed maximum: {exc}") from None
        if total < 0 or at != at:  # NaN
            raise ValueError("not an observed maximum: a negative total or no time")
        return cls(at, total, top)


def now_of(view: Headroom, at: float) -> Together | None:
    """A headroom view's moment (None: the view has no figure for now)."""
    if view.sum_now_bytes is None:
        return None
    return Together(at, view.sum_now_bytes, tuple(view.now_top))


def observed_of(view: Headroom) -> Together | None:
    """The daemon's own maximum as a view carries it (None: none, or an older daemon)."""
    if view.observed_sum_max_bytes is None or view.observed_sum_max_at is None:
        return None
    return Together(view.observed_sum_max_at, view.observed_sum_max_bytes, tuple(view.observed_top))


class HighestTogether:
    """Per resource (``Headroom.resource``), the moment of the highest total seen: the fold."""

    def __init__(self, best: Mapping[str, Together] | None = None) -> None:
        self.best: dict[str, Together] = dict(best or {})
        #: Grows with every new maximum (what the state keeper checks before a save).
        self.version = 0

    def see(self, resource: str, moment: Together) -> Together:
        """Fold ``moment`` in; the maximum so far. A tie keeps the earlier moment (a
        recording's snapshot may come after the daemon's maximum it repeats)."""
        best = self.best.get(resource)
        if best is None or moment.total > best.total or (moment.total == best.total and moment.at < best.at):
            self.best[resource] = best = moment
            self.version += 1
        return best

    def marked(self, view: Headroom, at: float) -> Headroom:
        """``view`` with its moment folded in and the maximum written into it."""
        moment = now_of(view, at)
        best = self.see(view.resource, moment) if moment is not None else self.best.get(view.resource)
        if best is None:
            return view
        return replace(view, observed_sum_max_bytes=best.total, observed_sum_max_at=best.at,
                       observed_top=list(best.top))

    def to_json(self) -> dict[str, Any]:
        return {resource: m.to_json() for resource, m in self.best.items()}

    @classmethod
    def from_json(cls, data: object) -> HighestTogether:
        """The state file's ``observed`` object; ValueError when it is not one."""
        if not isinstance(data, dict):
            raise ValueError("observed: not an object")
        return cls({str(resource): Together.from_json(m) for resource, m in data.items()})


def moments_of(at: float, views: list[Headroom]) -> Iterator[tuple[str, Together]]:
    """What a recorded headroom snapshot (taken at ``at``) tells: each view's total then,
    and the daemon's own maximum with the moment it was reached. The recorder writes a
    snapshot after each new maximum, so a range that holds the daemon's maximum gives it
    exactly; a lower total is known at the snapshots' moments, at most a second apart
    while the total moves (the reader keeps the moments inside its range)."""
    for view in views:
        for moment in (now_of(view, at), observed_of(view)):
            if moment is not None:
                yield view.resource, moment
