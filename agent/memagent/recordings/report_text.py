"""``memagent report``'s text for people: the lines of the report that
:func:`memagent.recordings.analysis.report_json` builds (``--json`` prints that object)."""

from __future__ import annotations

import time
from typing import Any

from memproto.text import printable

from ..prose import frame_text, human_bytes

#: Frames of the stack at the peak shown in text (JSON has them all).
STACK_FRAMES = 5


def _clock(t: float | None) -> str:
    return "n/a" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "es" if what.endswith("s") else "s")


def text_lines(r: dict[str, Any]) -> list[str]:
    """``memagent report`` without ``--json``: ``r`` is :func:`~.analysis.report_json`'s."""
    where = ", ".join(printable(p) for p in r["source"])
    if r["first_time"] is None:
        return [f"recording {where}: nothing recorded in this window"]
    lines = [f"recording {where}: host {printable(r['host'])}, {_count(r['segments'], 'segment')}"]
    lines[0] += (f", {_clock(r['first_time'])} to {_clock(r['last_time'])} "
                 f"({_duration(r['last_time'] - r['first_time'])}, {r['samples']} samples)")
    if r.get("command"):
        lines.append(f"memagent run of: {printable(' '.join(r['command']))}")
    shown = len(r["processes"])
    lines.append(f"top {shown} of {_count(r['processes_total'], 'process')} by peak"
                 + (" (<=: reached before the window began, when exactly is not recorded):"
                    if any(p["peak_before_window"] for p in r["processes"]) else ":"))
    gpu = any(p["vram_peak_bytes"] is not None for p in r["processes"])
    lines.append(f"  {'PID':>7}  {'NAME':<24} {'PEAK':>10}  {'  WHEN':<21}" + (f" {'VRAM PEAK':>10}" if gpu else "")
                 + "  EXITED")
    for p in r["processes"]:
        name = printable(p["label"] or p["name"] or "")[:24]
        peak = human_bytes(p["peak_bytes"]) + ("" if p["peak_exact"] else "~")
        vram = f" {human_bytes(p['vram_peak_bytes']):>10}" if gpu else ""
        exited = _clock(p["exited_at"]) if p["exited_at"] is not None else "-"
        when = ("<=" if p["peak_before_window"] else "  ") + _clock(p["peak_time"])
        lines.append(f"  {p['pid']:>7}  {name:<24} {peak:>10}  {when:<21}{vram}  {exited}")
        stack = p["stack"]
        if stack is not None and stack["frames"]:
            thread = printable(stack["thread_name"] or str(stack["thread_id"]))
            lines.append(f"           stack at the peak ({_clock(stack['time'])}, thread {thread}, innermost first):")
            lines.extend(f"             {frame_text(f['name'], f['filename'], f['line'])}"
                         for f in stack["frames"][:STACK_FRAMES])
    s = r["sum_peaks"]
    if s is not None:
        source = s.get("capacity_source")
        what = {"configured": "configured capacity", "derived": "capacity", "ram": "RAM"}.get(source, "capacity")
        ram = (f"; host RAM {human_bytes(s['ram_bytes'])}"
               if s.get("ram_bytes") and s["ram_bytes"] != s["capacity_bytes"] else "")
        cap = (f" of {human_bytes(s['capacity_bytes'])} {what} ({s['ratio']:.0%}{ram})"
               if s["capacity_bytes"] and s["ratio"] is not None else "")
        lines.append(f"highest Σ peaks: {human_bytes(s['bytes'])} at {_clock(s['time'])}{cap}")
    lines.extend(together_lines(r))
    lines.append(f"alerts: {len(r['alerts']) or 'none'}")
    for a in r["alerts"]:
        ended = f" -> {a['state']} {_clock(a['last_time'])}" if a["last_time"] != a["time"] else ""
        lines.append(f"  {_clock(a['time'])}  {a['severity']:<8} {printable(a['kind'])} "
                     f"[{printable(a['resource'])}] {printable(a['state']) if not ended else 'firing'}{ended}: "
                     f"{printable(a['message'])}")
    lines.append(f"OOM kills: {len(r['oom_kills']) or 'none'}")
    for o in r["oom_kills"]:
        lines.append(f"  {_clock(o['time'])}  pid {o['pid']}: {printable(o['message'])}")
    if r["damage"]:
        lines.append(f"damaged parts skipped: {len(r['damage'])} (listed on stderr)")
    return lines


def _parts(top: list[dict[str, Any]]) -> str:
    return ", ".join(f"{printable(c['label'])} ({c['pid']}) {human_bytes(c['bytes'])}" for c in top)


def together_lines(r: dict[str, Any]) -> list[str]:
    """The observed bound beside Σ peaks, the moments of highest total together, and
    which of the top processes peaked together (docs/headroom.md, "Two bounds")."""
    lines = []
    if r.get("observed"):
        lines.append("seen together (observed: a lower bound, peaks between ticks not summed; Σ peaks the upper):")
    for o in r.get("observed", []):
        cap = f" = {o['ratio']:.0%} of {human_bytes(o['capacity_bytes'])}" if o["ratio"] is not None else ""
        worst = f"; Σ peaks {human_bytes(o['sum_peaks_bytes'])}" if o["sum_peaks_bytes"] is not None else ""
        lines.append(f"  {printable(o['name'])}: {human_bytes(o['bytes'])} at {_clock(o['time'])}{cap}{worst}")
    if r.get("together_moments"):
        lines.append("highest moments together (host memory), largest parts:")
    for m in r.get("together_moments", []):
        lines.append(f"  {_clock(m['time'])}  {human_bytes(m['bytes'])}: {_parts(m['top']) or '-'}")
    if r.get("peaks_together"):
        lines.append("peaks together (both at >= 90% of their highest sampled RSS at the same sample):")
    for p in r.get("peaks_together", []):
        share = f" ({p['fraction']:.0%})" if p["fraction"] is not None else ""
        lines.append(f"  {printable(p['a']['name'])} ({p['a']['pid']}) & {printable(p['b']['name'])} "
                     f"({p['b']['pid']}): {p['both_samples']} of {p['either_samples']} samples{share}")
    return lines
