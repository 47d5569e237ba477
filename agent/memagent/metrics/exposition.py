"""A :class:`~memagent.metrics.snapshot.MetricsSnapshot` in the Prometheus text format
(0.0.4) or in OpenMetrics 1.0.0, one metric family at a time (docs/metrics.md).

Written here rather than with prometheus-client: at 1000 watched processes its
``generate_latest()`` takes 30-55 ms (OpenMetrics more) of the daemon's only thread, in
one piece, about the 50 ms a scrape may take and ten times the 5 ms a tick may be
delayed, and importing it adds ~2.5 MB to the daemon's RSS; this renders the same
families in ~3 ms, a family at a time (bench/metrics_scrape.py measures both). The tests read the output with
prometheus-client's parsers and a real Prometheus.

Pure: a snapshot in, text out. Label values are escaped (``\\``, ``"``, newline) and
control characters replaced, so a process name can neither forge a series nor send a
terminal escape; the command line is never shown (it can hold secrets).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from functools import lru_cache

from .snapshot import MetricsSnapshot, ProcessFigures

LEAK_ETA = "memagent_process_leak_eta_seconds"
#: What becomes U+FFFD in a label value: every C0 and C1 control character and DEL (a process
#: name may hold ESC or BEL, which a terminal showing the exposition would obey; the formats
#: escape only ``\\``, ``"`` and newline) and lone surrogates (a name that is not UTF-8).
_UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

#: The per-process families: name, help, and the figure of a row (None: no sample).
PROCESS_FAMILIES: tuple[tuple[str, str, Callable[[ProcessFigures], float | int | None]], ...] = (
    ("memagent_process_rss_bytes", "Resident memory now.", lambda r: r.rss),
    ("memagent_process_rss_peak_bytes", "Peak resident memory over the peak window (max of the kernel's VmHWM "
                                        "and every sample).", lambda r: r.rss_peak),
    ("memagent_process_vram_bytes", "GPU memory now, all GPUs together (absent when unknown).", lambda r: r.vram),
    ("memagent_process_vram_peak_bytes", "Peak GPU memory over the peak window (absent when unknown).",
     lambda r: r.vram_peak),
    ("memagent_process_growth_bytes_per_second", "RSS growth since its latest low, as the leak check measures "
                                                 "it (0: not growing).", lambda r: r.growth),
    ("memagent_process_peak_exact", "1 when the RSS peak includes the kernel's high-water mark, else 0.",
     lambda r: int(r.peak_exact)),
    (LEAK_ETA, "Seconds until the headroom the process is in (the host's, or its limited cgroup's) is gone at "
               "its growth pace, as the leak check computes it (absent when not growing).",
     lambda r: r.leak_eta if math.isfinite(r.leak_eta) else None),
)
#: How a label's figure is made of its processes' (``per_process = "label"``).
PER_LABEL = {LEAK_ETA: " The soonest of the label's processes."}


def escape(value: str) -> str:
    """A label value as both formats quote it; a control character, or text that is not
    UTF-8 (a process name read as bytes), becomes U+FFFD rather than reaching a terminal
    or making an invalid exposition. The fast path is ``str.isprintable`` (one pass in C):
    only a value it refuses goes through the pattern."""
    value = value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    if not value.isprintable():
        value = _UNSAFE.sub("\N{REPLACEMENT CHARACTER}", value)
    return value


def number(x: float | int) -> str:
    if isinstance(x, int):
        return str(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(x)


def _labels(**pairs: str) -> str:
    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in pairs.items()) + "}"


def _head(name: str, kind: str, help_text: str) -> str:
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"


def _gauge(name: str, help_text: str, samples: list[tuple[str, float | int]]) -> str:
    return _head(name, "gauge", help_text) + "".join(f"{name}{labels} {number(v)}\n" for labels, v in samples)


@lru_cache(maxsize=4096)
def process_labels(pid: int, name: str, label: str) -> str:
    """The label set of a process's series (of a label's: ``pid`` 0). Kept from one
    scrape to the next: a process's seldom change, and escaping them is half the work.
    4096 of them at most (~1 MB); beyond that many processes the cache only misses."""
    return _labels(label=label) if pid == 0 else _labels(pid=str(pid), name=name, label=label)


def _process_families(s: MetricsSnapshot) -> Iterator[str]:
    rows = s.processes
    keys = [process_labels(r.pid, r.name, r.label) for r in rows]
    for name, help_text, figure in PROCESS_FAMILIES:
        samples = [(k, v) for k, v in zip(keys, map(figure, rows), strict=True) if v is not None]
        yield _gauge(name, help_text + (PER_LABEL.get(name, " Summed per label.") if s.per_label else ""), samples)


def _host_families(s: MetricsSnapshot, openmetrics: bool) -> Iterator[str]:
    h = s.headroom
    yield (_gauge("memagent_headroom_sum_peaks_bytes", "Σ of the watched processes' peaks (host: share-adjusted).",
                  [(_labels(resource=x.resource), x.sum_peaks) for x in h])
           + _gauge("memagent_headroom_observed_sum_max_bytes", "The highest total of the watched processes' memory "
                    "seen at one tick (share-adjusted as Σ peaks): a lower bound, Σ peaks the upper.",
                    [(_labels(resource=x.resource), x.observed_sum_max) for x in h if x.observed_sum_max is not None])
           + _gauge("memagent_headroom_capacity_bytes", "Memory the watched processes may use altogether.",
                    [(_labels(resource=x.resource), x.capacity) for x in h])
           + _gauge("memagent_headroom_ratio", "Σ peaks / capacity (absent when the capacity is 0).",
                    [(_labels(resource=x.resource), x.ratio) for x in h if x.ratio is not None])
           + _gauge("memagent_headroom_warn_fraction", "The ratio at which a headroom alert warns ([alerts] "
                    "warn_fraction).", [("", s.warn_fraction)]))
    # Its name apart, so that a name learnt later (a container's) starts no new series.
    info = "The name of a headroom resource (always 1)."
    names: list[tuple[str, float | int]] = [(_labels(resource=x.resource, name=x.name), 1) for x in h]
    if openmetrics:
        yield _head("memagent_headroom_resource", "info", info) + "".join(
            f"memagent_headroom_resource_info{labels} 1\n" for labels, _ in names)
    else:
        yield _gauge("memagent_headroom_resource_info", info, names)
    yield (_gauge("memagent_alert_firing", "1 for each alert firing now.",
                  [(_labels(kind=k, resource=r, severity=sev), 1) for k, r, sev in s.firing])
           + _gauge("memagent_label_budget_bytes", "The configured budget of a label ([budgets]).",
                    [(_labels(label=label), b) for label, b in s.budgets])
           + _gauge("memagent_label_rss_peak_bytes", "Σ of the share-adjusted peaks a label's budget is held to.",
                    [(_labels(label=label), p) for label, p in s.label_peaks])
           + _gauge("memagent_watched_processes", "Live watched processes.", [("", s.watched)]))
    t = s.tick
    name = "memagent_tick_duration_seconds"
    buckets = [*(number(b) for b in t.bounds), "+Inf"]
    yield (_head(name, "histogram", "How long each tick (sample, alerts, fan-out) took.")
           + "".join(f'{name}_bucket{{le="{le}"}} {n}\n' for le, n in zip(buckets, t.cumulative, strict=True))
           + f"{name}_count {t.count}\n{name}_sum {number(t.total)}\n")
    dumps = "memagent_stack_dumps" if openmetrics else "memagent_stack_dumps_total"
    yield (_head(dumps, "counter", "py-spy stack dumps started.") + f"memagent_stack_dumps_total {s.stack_dumps}\n")
    build = _labels(version=s.version, protocol=s.protocol)
    if openmetrics:
        yield _head("memagent_build", "info", "The daemon's version and protocol.") + f"memagent_build_info{build} 1\n"
    else:
        yield _gauge("memagent_build_info", "The daemon's version and protocol (always 1).", [(build, 1)])


def render(s: MetricsSnapshot, openmetrics: bool = False) -> Iterator[str]:
    """The exposition, one chunk per family or group of small families, so that a caller
    on the event loop can give way between chunks (:mod:`memagent.metrics.http`)."""
    yield from _process_families(s)
    yield from _host_families(s, openmetrics)
    if openmetrics:
        yield "# EOF\n"


def render_text(s: MetricsSnapshot, openmetrics: bool = False) -> str:
    return "".join(render(s, openmetrics))
