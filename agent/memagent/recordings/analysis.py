"""What ``memagent report`` says of a recording, as data (its ``--json``, docs/cli.md): the
processes by peak with the stack at each peak, the highest Σ of peaks against the box,
the alerts and OOM kills of the window. Pure: a :class:`~.timeline.Timeline` in, JSON-ready
dicts out; the text of it: :mod:`.report_text`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memproto.records import Alert, StackDump, ThreadStack
from memproto.vocabulary import AlertKind, Resource

from ..alerting.observed import Together
from .timeline import Timeline, Track

SEVERITY_RANK = {"warning": 1, "critical": 2}
#: A process is near its peak at a sample when its RSS is at least this part of its own
#: highest sampled RSS in the window.
NEAR_PEAK = 0.9
#: The moments of highest simultaneous total listed, and the processes paired.
MOMENTS = 3
#: Two moments listed are at least this far apart (seconds).
MOMENTS_APART = 5.0
PAIRED = 5


def stack_thread(dump: StackDump) -> ThreadStack | None:
    """The thread the peak is blamed on: the attributed one, else the first active, else the first."""
    return dump.attributed() or next((t for t in dump.threads if t.active), None) or next(iter(dump.threads), None)


def stack_json(dump: StackDump | None) -> dict[str, Any] | None:
    if dump is None:
        return None
    thread = stack_thread(dump)
    return {"time": dump.time, "trigger": dump.trigger, "rss_bytes": dump.rss_bytes,
            "thread_id": thread.thread_id if thread else None, "thread_name": thread.name if thread else None,
            "frames": [{"name": f.name, "filename": f.filename, "line": f.line} for f in thread.frames]
            if thread else []}


def peak_before_window(t: Track, interval: float) -> bool:
    """Whether the peak was already reached when the window first saw the process (it
    started, or was attached, before): then ``peak_time`` is that first sample's, and the
    moment of the peak itself is not in the window."""
    first = t.times[0] if t.times else t.peak_time
    return first is not None and t.peak_time is not None and t.peak_time <= first \
        and t.start_time < first - max(interval, 1.0)


def track_json(t: Track, interval: float) -> dict[str, Any]:
    return {"pid": t.pid, "start_time": t.start_time, "name": t.name, "label": t.label, "cmdline": t.cmdline,
            "peak_bytes": t.peak_bytes, "peak_time": t.peak_time, "peak_exact": t.peak_exact,
            "peak_before_window": peak_before_window(t, interval),
            "vram_peak_bytes": t.vram_peak_bytes, "vram_peak_time": t.vram_peak_time, "exited_at": t.exited_at,
            "stack": stack_json(t.peak_stack)}


def alerts_json(alerts: list[Alert]) -> list[dict[str, Any]]:
    """One entry per alert (its id): when it first fired in the window, its most severe
    level, its last state, message and time."""
    out: dict[int, dict[str, Any]] = {}
    for a in sorted(alerts, key=lambda a: a.time):
        entry = out.get(a.id)
        if entry is None:
            entry = out[a.id] = {"id": a.id, "kind": a.kind, "resource": a.resource, "pid": a.pid,
                                 "severity": a.severity, "time": a.time}
        elif SEVERITY_RANK.get(a.severity, 0) > SEVERITY_RANK.get(entry["severity"], 0):
            entry["severity"] = a.severity
        entry.update(state=a.state, last_time=a.time, message=a.message, value=a.value, threshold=a.threshold,
                     unit=a.unit)
    return list(out.values())


def oom_json(a: Alert) -> dict[str, Any]:
    return {"time": a.time, "pid": a.pid, "resource": a.resource, "severity": a.severity, "message": a.message,
            "source": a.source, "details": a.details}


def report_json(tl: Timeline, paths: list[str], top: int) -> dict[str, Any]:
    highest = tl.highest_sum()
    sums: dict[str, Any] | None = None
    if highest is not None:
        when, total = highest
        cap = tl.capacity_bytes
        raw = tl.highest_raw_sum()
        sums = {"bytes": total, "time": when, "capacity_bytes": cap,
                "ratio": round(total / cap, 4) if cap else None,
                #: ``bytes`` is the daemon's share-adjusted Σ (its headroom snapshots), as its
                #: alerts judged it; false: the raw sum of the recorded rows' peaks.
                "share_adjusted": tl.share_adjusted,
                "unadjusted_bytes": raw[1] if raw is not None else None,
                #: Where the capacity comes from: "configured" ([host] capacity), "derived"
                #: (the daemon's RAM - reserve - unwatched), "ram" (no headroom recorded).
                "capacity_source": ("configured" if tl.capacity_configured else "derived")
                if tl.judged_capacity_bytes is not None else "ram",
                "ram_bytes": tl.ram_bytes}
    tracks = tl.by_peak()
    return {"source": paths, "host": tl.host, "command": tl.command, "interval": tl.interval, "segments": tl.segments,
            "first_time": tl.first, "last_time": tl.last, "samples": len(tl.sum_peaks),
            "processes_total": len(tracks), "processes": [track_json(t, tl.interval) for t in tracks[:top]],
            "sum_peaks": sums, "alerts": alerts_json([a for a in tl.alerts if a.kind != AlertKind.OOM_KILL]),
            "oom_kills": [oom_json(a) for a in tl.oom_kills], "damage": tl.damage,
            "observed": observed_json(tl), "together_moments": highest_moments(tl),
            "peaks_together": peaks_together(tl, min(top, PAIRED))}


def moment_json(m: Together) -> dict[str, Any]:
    return {"time": m.at, "bytes": m.total,
            "top": [{"pid": c.pid, "label": c.label, "bytes": c.peak_bytes} for c in m.top]}


def observed_json(tl: Timeline) -> list[dict[str, Any]]:
    """Per headroom resource (the host first), the observed bound over the window beside
    the highest Σ peaks there: the highest total seen together (a lower bound, peaks
    between ticks not summed together) and Σ peaks (an upper one). docs/headroom.md."""
    out = []
    best = tl.highest_together().best
    for resource in sorted(best, key=lambda r: (r != Resource.HOST, r)):
        m, cap = best[resource], tl.resource_capacity.get(resource)
        out.append({"resource": resource, "name": tl.resource_names.get(resource, resource), **moment_json(m),
                    "sum_peaks_bytes": tl.resource_sum_peaks.get(resource), "capacity_bytes": cap,
                    "ratio": round(m.total / cap, 4) if cap else None})
    return out


def highest_moments(tl: Timeline, n: int = MOMENTS) -> list[dict[str, Any]]:
    """The host's ``n`` moments of highest total together, each with its largest parts, at
    least :data:`MOMENTS_APART` seconds apart (the snapshots of one meeting of peaks, and
    the daemon's maximum among them, are one moment: its highest, earliest)."""
    chosen: list[Together] = []
    for m in sorted(tl.together.get(Resource.HOST, []), key=lambda m: (-m.total, m.at)):
        if len(chosen) < n and all(abs(m.at - c.at) >= MOMENTS_APART for c in chosen):
            chosen.append(m)
    return [moment_json(m) for m in chosen]


def peaks_together(tl: Timeline, n: int = PAIRED) -> list[dict[str, Any]]:
    """For the ``n`` processes of highest peak, each pair: at how many samples both were
    near their own peak (:data:`NEAR_PEAK` of their highest sampled RSS), of the samples
    where either was; ``fraction`` 0: their peaks never met at a tick."""
    near: list[tuple[Track, set[float]]] = []
    for t in tl.by_peak()[:n]:
        top = max(t.rss, default=0)
        if top:
            near.append((t, {when for when, rss in zip(t.times, t.rss, strict=True) if rss >= NEAR_PEAK * top}))
    out = []
    for i, (a, near_a) in enumerate(near):
        for b, near_b in near[i + 1:]:
            both, either = len(near_a & near_b), len(near_a | near_b)
            out.append({"a": {"pid": a.pid, "name": a.title}, "b": {"pid": b.pid, "name": b.title},
                        "both_samples": both, "either_samples": either,
                        "fraction": round(both / either, 4) if either else None})
    return sorted(out, key=lambda p: -(p["fraction"] or 0))


def missing_asked(tl: Timeline, pids: Sequence[int], labels: Sequence[str]) -> list[str]:
    """What was asked for (``--pid``, ``--label``) that has no samples in ``tl``, one line each."""
    tracks = tl.tracks.values()
    missing = [f"no samples of PID {pid}" for pid in pids if not any(t.pid == pid for t in tracks)]
    return missing + [f"no samples of a process labelled {label!r}" for label in labels
                      if not any(t.label == label for t in tracks)]
