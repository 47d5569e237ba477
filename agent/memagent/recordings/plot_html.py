"""``memagent plot -o OUT.html``: one self-contained page that opens offline.

The page holds its data as JSON in ``<script type="application/json" id="memagent-data">``
(the contract a script may read: :func:`payload`), its drawing code and styles inline
(``memagent/data/plot.js``, ``plot.css``: a canvas, no library), and a Content Security
Policy that forbids every fetch. It names no ``http://`` or ``https://`` address at all.

Labels, process names and command lines are untrusted: the JSON escapes ``<``, ``>``, ``&``
and ``/`` (so no text can close the script, open a comment or spell an address), the
page's few words of its own are HTML-escaped (``/`` too), and the script shows names through
``textContent`` only.
"""

from __future__ import annotations

import html
import json
from importlib import resources

from memproto.text import printable

from .plot_data import PlotData, ProcessSeries
from .timeline import iso

#: Version of the embedded JSON's layout (a key added keeps it; a key changed bumps it).
DATA_FORMAT = 1
DATA_ID = "memagent-data"

#: Fetching nothing is the rule, not the habit: the browser enforces it.
CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="memagent plot">
<title>{title}</title>
<style>
{css}</style>
</head>
<body>
<h1>{title}</h1>
<p class="sub">{summary}</p>
<div id="wrap">
<div id="plot">
<canvas id="box"></canvas>
<canvas id="rss"></canvas>
<canvas id="vram"></canvas>
<div id="tip" hidden></div>
</div>
<ul id="legend"></ul>
</div>
<noscript>This page draws with JavaScript; its data is in the script element with id {data_id}.</noscript>
<script type="application/json" id="{data_id}">{data}</script>
<script>
{js}</script>
</body>
</html>
"""


def _process(p: ProcessSeries) -> dict[str, object]:
    return {
        "pid": p.pid, "start_time": p.start_time, "title": p.title, "name": p.name, "label": p.label,
        "cmdline": p.cmdline, "samples": p.samples,
        "rss": [[t, b] for t, b in p.rss], "vram": [[t, b] for t, b in p.vram],
        "peak_bytes": p.peak_bytes, "peak_time": p.peak_time, "peak_exact": p.peak_exact,
        "vram_peak_bytes": p.vram_peak_bytes, "vram_peak_time": p.vram_peak_time, "exited_at": p.exited_at,
        "colour": p.colour,
    }


def payload(data: PlotData) -> dict[str, object]:
    """The embedded JSON: times in Unix seconds, sizes in bytes, points as ``[time, bytes]``;
    processes by peak, highest first."""
    return {
        "format": DATA_FORMAT,
        "host": data.host,
        "interval": data.interval,
        "first": data.first,
        "last": data.last,
        "samples": data.samples,
        "capacity_bytes": data.capacity_bytes,
        "capacity_shown": data.show_capacity(),
        "gap_seconds": data.gap_seconds,
        "capacity_words": data.capacity_words() if data.capacity_bytes is not None else None,
        "sum_peaks": [[t, b] for t, b in data.sum_peaks],
        "sum_label": data.SUM_LABEL,
        "judged_sum_peaks": [[t, b] for t, b in data.judged_sum_peaks],
        "judged_label": data.JUDGED_LABEL,
        "together": [[t, b] for t, b in data.together],
        "together_label": data.TOGETHER_LABEL,
        "judged_gap_seconds": data.judged_gap_seconds,
        "processes": [_process(p) for p in data.processes],
        "alerts": [{"id": a.id, "time": a.time, "kind": a.kind, "severity": a.severity, "state": a.state,
                    "message": a.message, "pid": a.pid, "labelled": labelled}
                   for a, labelled in zip(data.alerts, data.labelled_alerts(), strict=True)],
        "exits": [{"pid": p.pid, "start_time": p.start_time, "time": p.exited_at, "title": p.title}
                  for p in data.processes if p.exited_at is not None],
    }


def script_json(value: object) -> str:
    """JSON that is inert inside a ``<script>`` element: ``<``, ``>``, ``&`` as ``\\u`` escapes
    and ``/`` as ``\\/`` (all valid JSON, decoded back by any parser)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("/", "\\/"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(raw, escaped)
    return text


def html_text(text: str) -> str:
    """Text for the page's markup: escaped, and ``/`` as ``&#47;`` (a crafted recording's
    host name cannot spell an address either)."""
    return html.escape(printable(text)).replace("/", "&#47;")


def _asset(name: str) -> str:
    return (resources.files("memagent") / "data" / name).read_text(encoding="utf-8")


def render(data: PlotData, page_title: str) -> bytes:
    """The page, UTF-8."""
    processes = len(data.processes)
    summary = (f"{processes} process{'es' if processes != 1 else ''}, {data.samples} samples "
               f"from {iso(data.first)} to {iso(data.last)}; hover for values, click a legend entry to hide it.")
    page = _TEMPLATE.format(
        csp=CSP, title=html_text(page_title), summary=html_text(summary), data_id=DATA_ID,
        data=script_json(payload(data)), css=_asset("plot.css"), js=_asset("plot.js"),
    )
    return page.encode("utf-8")
