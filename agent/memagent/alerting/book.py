"""Alert state: firing and resolved, with hysteresis and deduplication.

An alert is keyed by ``(kind, resource)``: while it fires, re-evaluating it produces
nothing unless its severity changes, so a value that stays above the threshold raises
one alert, not one per tick. It resolves only once the value falls below
``threshold * (1 - hysteresis)``, so a value hovering at the threshold does not flap.
Events (``oom-kill``) fire once and go straight to the recent list.

:class:`AlertBook` only decides; whoever owns it delivers (log line, protocol frame,
hook command: see :mod:`memagent.alerting.hooks`).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from memproto.records import Alert, Contributor
from memproto.vocabulary import AlertState, Severity


@dataclass(frozen=True, slots=True)
class Reading:
    """One evaluation of a condition: its value now, and how to describe it."""

    kind: str
    resource: str
    value: float
    warn: float
    critical: float
    unit: str
    message: str
    contributors: list[Contributor]
    pid: int | None = None
    eta_seconds: float | None = None


class AlertBook:
    def __init__(self, hysteresis: float, recent: int, deliver: Callable[[Alert], None],
                 clock: Callable[[], float] = time.time) -> None:
        self.hysteresis = hysteresis
        self.deliver = deliver
        self.clock = clock
        self.active: dict[tuple[str, str], Alert] = {}
        self.recent: deque[Alert] = deque(maxlen=recent)
        self._ids = itertools.count(1)

    def apply(self, hysteresis: float, recent: int) -> None:
        """A reload: the new hysteresis; the recent list resized, its newest kept."""
        self.hysteresis = hysteresis
        if self.recent.maxlen != recent:
            self.recent = deque(self.recent, maxlen=recent)

    def _severity(self, r: Reading, current: str | None) -> str | None:
        """The severity ``r`` deserves, with hysteresis relative to ``current``."""
        keep = 1 - self.hysteresis
        if r.value >= r.critical or (current == Severity.CRITICAL and r.value >= r.critical * keep):
            return Severity.CRITICAL
        if r.value >= r.warn or (current is not None and r.value >= r.warn * keep):
            return Severity.WARNING
        return None

    def evaluate(self, r: Reading) -> None:
        key = (r.kind, r.resource)
        old = self.active.get(key)
        severity = self._severity(r, old.severity if old else None)
        if severity is None:
            if old is not None:
                self._end(key, old, r)
            return
        if old is not None and old.severity == severity:
            # Still firing: keep the figures current for status, without a new delivery.
            self.active[key] = replace(old, value=r.value, contributors=r.contributors, message=r.message,
                                       eta_seconds=r.eta_seconds)
            return
        threshold = r.critical if severity == Severity.CRITICAL else r.warn
        alert = Alert(
            id=old.id if old else next(self._ids), kind=r.kind, state=AlertState.FIRING, severity=severity,
            resource=r.resource, value=r.value, threshold=threshold, message=r.message, time=self.clock(),
            contributors=r.contributors, unit=r.unit, pid=r.pid, eta_seconds=r.eta_seconds,
        )
        self.active[key] = alert
        self.deliver(alert)

    def clear(self, kind: str, resource: str, message: str) -> None:
        """The condition no longer exists (a process detached, a GPU gone): resolve it,
        with no contributors left."""
        old = self.active.get((kind, resource))
        if old is not None:
            self._end((kind, resource), old, None, message)

    def _end(self, key: tuple[str, str], old: Alert, r: Reading | None, message: str | None = None) -> None:
        """Resolved, with the figures of the evaluation that ended it: its value and its
        contributors now (a process detached meanwhile is no longer among them)."""
        del self.active[key]
        ended = replace(old, state=AlertState.RESOLVED, time=self.clock(),
                        value=r.value if r else old.value, contributors=r.contributors if r else [],
                        eta_seconds=r.eta_seconds if r else None,
                        message=message or (f"resolved: {r.message}" if r else f"resolved: {old.message}"))
        self.recent.appendleft(ended)
        self.deliver(ended)

    def event(self, alert: Alert) -> Alert:
        """A one-off (oom-kill): delivered once as firing, kept among the recent."""
        alert = replace(alert, id=next(self._ids), state=AlertState.FIRING, time=alert.time or self.clock())
        self.recent.appendleft(alert)
        self.deliver(alert)
        return alert

    def resources(self, kind: str) -> set[str]:
        return {res for k, res in self.active if k == kind}
