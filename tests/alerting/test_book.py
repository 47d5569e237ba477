"""The alert state machine (:class:`memagent.alerting.book.AlertBook`): hysteresis and
deduplication."""

from __future__ import annotations

from memagent.alerting.book import AlertBook, Reading
from memproto.records import Alert

# --------------------------------------------------------------------------- state machine


def test_a_value_hovering_at_the_threshold_raises_one_alert_not_many() -> None:
    delivered: list[Alert] = []
    book = AlertBook(hysteresis=0.05, recent=10, deliver=delivered.append, clock=lambda: 0.0)
    # 0.9 warn; it resolves only below 0.855: these wobble across 0.9 without resolving.
    for value in [0.80, 0.91, 0.89, 0.92, 0.88, 0.905, 0.87, 0.91, 0.86]:
        book.evaluate(Reading("headroom", "host", value, 0.9, 1.0, "ratio", "m", []))
    assert [(a.state, a.severity) for a in delivered] == [("firing", "warning")]
    book.evaluate(Reading("headroom", "host", 0.80, 0.9, 1.0, "ratio", "m", []))
    assert [(a.state, a.severity) for a in delivered] == [("firing", "warning"), ("resolved", "warning")]
    assert delivered[0].id == delivered[1].id and not book.active and len(book.recent) == 1


def test_severity_escalates_and_comes_back_with_hysteresis() -> None:
    delivered: list[Alert] = []
    book = AlertBook(hysteresis=0.05, recent=10, deliver=delivered.append)
    for value in [0.95, 1.02, 0.99, 0.96, 0.94, 0.5]:
        book.evaluate(Reading("headroom", "host", value, 0.9, 1.0, "ratio", "m", []))
    assert [(a.state, a.severity) for a in delivered] == [
        ("firing", "warning"), ("firing", "critical"), ("firing", "warning"), ("resolved", "warning")]
    assert len({a.id for a in delivered}) == 1  # one alert, updated: deduplicated
