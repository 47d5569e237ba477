"""The exposition on plain values (docs/metrics.md): rendered by memagent.metrics.exposition,
read back with prometheus-client's own parsers of both formats, as a scraper reads it."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from memagent.config import split_listen
from memagent.core.histogram import Histogram
from memagent.metrics.exposition import render_text
from memagent.metrics.http import parse_head, wants_openmetrics
from memagent.metrics.snapshot import (
    HeadroomFigures,
    MetricsSnapshot,
    ProcessFigures,
    TickFigures,
    by_label,
    shown,
)

MiB = 1024 * 1024
GPU = "GPU-5e1d2c3b-aaaa-bbbb-cccc-0123456789ab"
CGROUP = "cgroup:/system.slice/docker-3f1c5e2a9b7d4c6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6.scope"


def snapshot(**changes: object) -> MetricsSnapshot:
    h = Histogram()
    for d in (0.0004, 0.003, 0.003, 0.2, 7.0):
        h.observe(d)
    base = MetricsSnapshot(
        per_label=False,
        processes=(
            ProcessFigures(101, "python3", "trainer", 300 * MiB, 500 * MiB, 2048 * MiB, 4096 * MiB, 1234.5, True,
                           6 * 3600.0),
            ProcessFigures(102, "python3", "trainer", 100 * MiB, 120 * MiB, None, None, 0.0, False),
            ProcessFigures(103, "nginx", "", 10 * MiB, 11 * MiB, 0, 0, 0.0, True),
        ),
        headroom=(HeadroomFigures("host", "host memory", 631 * MiB, 8192 * MiB, 631 / 8192, 402 * MiB),
                  HeadroomFigures(GPU, "GPU 0 NVIDIA A100", 4096 * MiB, 0, None),
                  HeadroomFigures(CGROUP, "docker web", 200 * MiB, 256 * MiB, 200 / 256)),
        firing=(("budget", "trainer", "warning"), ("headroom", "host", "critical")),
        warn_fraction=0.9,
        budgets=(("trainer", 600 * MiB),),
        label_peaks=(("trainer", 590 * MiB),),
        watched=3,
        tick=TickFigures(h.bounds, h.cumulative(), h.count, h.total),
        stack_dumps=7,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def samples(text: str, openmetrics: bool = False) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    families = parse_openmetrics(text) if openmetrics else parse_text(text)
    return {(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples}


def key(metric: str, /, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return metric, frozenset(labels.items())


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_every_metric_reads_back_as_given(openmetrics: bool) -> None:
    got = samples(render_text(snapshot(), openmetrics), openmetrics)
    p101 = {"pid": "101", "name": "python3", "label": "trainer"}
    assert got[key("memagent_process_rss_bytes", **p101)] == 300 * MiB
    assert got[key("memagent_process_rss_peak_bytes", **p101)] == 500 * MiB
    assert got[key("memagent_process_vram_bytes", **p101)] == 2048 * MiB
    assert got[key("memagent_process_vram_peak_bytes", **p101)] == 4096 * MiB
    assert got[key("memagent_process_growth_bytes_per_second", **p101)] == 1234.5
    assert got[key("memagent_process_peak_exact", **p101)] == 1
    assert got[key("memagent_process_leak_eta_seconds", **p101)] == 6 * 3600.0
    # Not growing: no series (one per process at +Inf was a quarter of a scrape's bytes).
    assert key("memagent_process_leak_eta_seconds", pid="102", name="python3", label="trainer") not in got
    assert got[key("memagent_process_peak_exact", pid="102", name="python3", label="trainer")] == 0
    # Unknown VRAM: no sample (not 0, which would claim the process holds none).
    assert key("memagent_process_vram_bytes", pid="102", name="python3", label="trainer") not in got
    assert got[key("memagent_process_vram_bytes", pid="103", name="nginx", label="")] == 0
    assert got[key("memagent_headroom_sum_peaks_bytes", resource="host")] == 631 * MiB
    assert got[key("memagent_headroom_capacity_bytes", resource="host")] == 8192 * MiB
    assert got[key("memagent_headroom_ratio", resource="host")] == pytest.approx(631 / 8192)
    assert got[key("memagent_headroom_observed_sum_max_bytes", resource="host")] == 402 * MiB
    assert key("memagent_headroom_observed_sum_max_bytes", resource=GPU) not in got  # none seen: no series
    assert got[key("memagent_headroom_sum_peaks_bytes", resource=GPU)] == 4096 * MiB
    assert key("memagent_headroom_ratio", resource=GPU) not in got  # capacity 0: no ratio
    assert got[key("memagent_headroom_ratio", resource=CGROUP)] == pytest.approx(200 / 256)  # a container's limit
    assert got[key("memagent_headroom_resource_info", resource=CGROUP, name="docker web")] == 1
    assert got[key("memagent_headroom_resource_info", resource="host", name="host memory")] == 1
    assert got[key("memagent_headroom_warn_fraction")] == 0.9
    assert got[key("memagent_alert_firing", kind="headroom", resource="host", severity="critical")] == 1
    assert got[key("memagent_alert_firing", kind="budget", resource="trainer", severity="warning")] == 1
    assert got[key("memagent_label_budget_bytes", label="trainer")] == 600 * MiB
    assert got[key("memagent_label_rss_peak_bytes", label="trainer")] == 590 * MiB
    assert got[key("memagent_watched_processes")] == 3
    assert got[key("memagent_stack_dumps_total")] == 7
    assert got[key("memagent_build_info", version="0.1.0", protocol=snapshot().protocol)] == 1
    bucket = "memagent_tick_duration_seconds_bucket"
    le = (lambda b: f"{b}") if not openmetrics else (lambda b: f"{float(b)}")
    assert got[key(bucket, le=le("0.001"))] == 1
    assert got[key(bucket, le=le("0.005"))] == 3
    assert got[key(bucket, le=le("0.25"))] == 4
    assert got[key(bucket, le="+Inf")] == 5
    assert got[key("memagent_tick_duration_seconds_count")] == 5
    assert got[key("memagent_tick_duration_seconds_sum")] == pytest.approx(7.2064)


def test_a_labels_leak_eta_is_its_soonest_processes() -> None:
    """Per label, figures are summed, but the time until the headroom is gone is the
    soonest one (a sum of ETAs means nothing); a label with none growing has no series."""
    s = snapshot(per_label=True, processes=by_label(snapshot().processes))
    text = render_text(s)
    got = samples(text)
    assert got[key("memagent_process_leak_eta_seconds", label="trainer")] == 6 * 3600.0
    assert key("memagent_process_leak_eta_seconds", label="") not in got
    assert "The soonest of the label's processes." in text


def test_openmetrics_types_and_end() -> None:
    text = render_text(snapshot(), openmetrics=True)
    assert text.endswith("# EOF\n")
    families = {f.name: f.type for f in parse_openmetrics(text)}
    assert families["memagent_stack_dumps"] == "counter"
    assert families["memagent_tick_duration_seconds"] == "histogram"
    assert families["memagent_build"] == "info"
    assert families["memagent_headroom_resource"] == "info"
    assert families["memagent_process_rss_peak_bytes"] == "gauge"


def test_a_hostile_name_cannot_forge_a_series() -> None:
    evil = 'x"} 1\nmemagent_headroom_ratio{resource="host"} 99\n\\'
    s = snapshot(processes=(ProcessFigures(7, evil, "a\nb", 1, 2, None, None, 0.0, True),), headroom=())
    for openmetrics in (False, True):
        got = samples(render_text(s, openmetrics), openmetrics)
        assert got[key("memagent_process_rss_bytes", pid="7", name=evil, label="a\nb")] == 1
        assert not any(name == "memagent_headroom_ratio" for name, _ in got)


def test_a_name_that_is_not_utf8_still_renders() -> None:
    s = snapshot(processes=(ProcessFigures(7, "py\udcff", "", 1, 2, None, None, 0.0, True),))
    got = samples(render_text(s))
    assert got[key("memagent_process_rss_bytes", pid="7", name="py\N{REPLACEMENT CHARACTER}", label="")] == 1


def test_a_name_with_control_characters_renders_none() -> None:
    """ESC, BEL, NUL, tab, DEL and C1 controls (CSI) from a process name or label become
    U+FFFD in both formats, and in nothing else of the exposition either."""
    name = "py\x1b]0;owned\x07\x00\t\x7f\x9b2J"
    label = "l\x1b[31mred"
    s = snapshot(processes=(ProcessFigures(7, name, label, 1, 2, None, None, 0.0, True),))
    for openmetrics in (False, True):
        text = render_text(s, openmetrics)
        assert not [c for c in text if c != "\n" and (ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f)]
        got = samples(text, openmetrics)
        assert got[key("memagent_process_rss_bytes", pid="7", name="py\ufffd]0;owned" + "\ufffd" * 4 + "\ufffd2J",
                       label="l\ufffd[31mred")] == 1


def test_per_label_sums_and_exact_only_when_all_are() -> None:
    rows = by_label(snapshot().processes)
    assert [r.label for r in rows] == ["", "trainer"]
    trainer = rows[1]
    assert (trainer.rss, trainer.rss_peak, trainer.vram, trainer.vram_peak) == (400 * MiB, 620 * MiB, 2048 * MiB,
                                                                                4096 * MiB)
    assert trainer.growth == 1234.5 and trainer.peak_exact is False
    got = samples(render_text(snapshot(per_label=True, processes=rows)))
    assert got[key("memagent_process_rss_peak_bytes", label="trainer")] == 620 * MiB
    assert got[key("memagent_process_peak_exact", label="")] == 1
    assert not any(("pid", "101") in labels for _, labels in got)


@dataclass
class Entry:
    pid: int
    alive: bool
    exited_at: float | None


def test_exited_processes_leave_after_the_ttl_and_a_reused_pid_shows_once() -> None:
    live, fresh, old = Entry(5, True, None), Entry(6, False, 95.0), Entry(7, False, 50.0)
    reused_old, reused_live = Entry(8, False, 99.0), Entry(8, True, None)
    out = shown([old, reused_live, fresh, live, reused_old], now=100.0, ttl=10.0)
    assert out == [live, fresh, reused_live]
    assert shown([fresh], now=105.0, ttl=10.0) == []  # exactly ttl after: gone


def test_content_negotiation_and_request_parsing() -> None:
    prometheus = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                  "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
    assert wants_openmetrics(prometheus)
    assert not wants_openmetrics("text/plain;version=0.0.4") and not wants_openmetrics("")
    method, path, headers = parse_head(b"GET /metrics?x=1 HTTP/1.1\r\nHost: h\r\nAccept: a/b\r\n\r\n")
    assert (method, path, headers["accept"]) == ("GET", "/metrics", "a/b")
    for garbage in (b"\x16\x03\x01\x02\x00\r\n\r\n", b"GET /metrics\r\n\r\n", b"GET metrics HTTP/1.1\r\n\r\n"):
        with pytest.raises(ValueError):
            parse_head(garbage)


@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:9478", ("127.0.0.1", 9478)), ("[::1]:0", ("::1", 0)), ("localhost:80", ("localhost", 80)),
    ("0.0.0.0:9478", ("0.0.0.0", 9478)),
])
def test_listen_addresses(text: str, expected: tuple[str, int]) -> None:
    assert split_listen(text) == expected


@pytest.mark.parametrize("text", ["9478", ":9478", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1", "::1:9478",
                                  "example.com:9478", "[127.0.0.1]:9478", "127.0.0.1:\uff19\uff14"])  # fullwidth digits
def test_bad_listen_addresses(text: str) -> None:
    with pytest.raises(ValueError):
        split_listen(text)
