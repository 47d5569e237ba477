"""The data ``memagent plot`` draws (``cli/plot_data.py``), in process: decimation keeps
every slice's extremes (no peak is lost), 100 000 points render in well under a second,
the highest peaks get the colours."""

from __future__ import annotations

import json
import re
import time

from plot_recording import T0, GiB, MiB

from memagent.recordings import plot_html, plot_mpl
from memagent.recordings.plot_data import decimate, plot_data
from memagent.recordings.timeline import Timeline, Track

# --------------------------------------------------------------------------- decimation


def test_decimate_keeps_each_slices_extremes() -> None:
    n, buckets = 100_000, 2000
    points = [(T0 + i * 0.5, (i * 7919) % 10007 * MiB) for i in range(n)]  # no order to its values
    kept = decimate(points, buckets)
    assert len(kept) <= 2 * buckets + 2 and kept[0] == points[0] and kept[-1] == points[-1]
    assert kept == sorted(set(kept)) and set(kept) <= set(points)  # a subsequence, in time order
    width = (points[-1][0] - T0) / buckets
    values: dict[int, list[int]] = {}
    drawn: dict[int, list[int]] = {}
    for source, into in ((points, values), (kept, drawn)):
        for t, v in source:
            into.setdefault(min(int((t - T0) / width), buckets - 1), []).append(v)
    assert len(values) == buckets
    for b, vs in values.items():  # every slice's lowest and highest value is drawn
        assert (min(drawn[b]), max(drawn[b])) == (min(vs), max(vs))
    assert decimate(points[:4000], buckets) == points[:4000]


def test_100k_points_render_in_reasonable_time() -> None:
    n = 100_000
    rss = [(100 + i % 13) * MiB + (GiB if i == 77_777 else 0) for i in range(n)]
    track = Track(pid=7, start_time=T0, name="big", times=[T0 + i * 0.5 for i in range(n)], rss=rss,
                  vram=[None] * n, peak_bytes=max(rss), peak_time=T0 + 77_777 * 0.5)
    tl = Timeline(host="big", interval=0.5, first=T0, last=track.times[-1], tracks={track.key: track},
                  sum_peaks=list(zip(track.times, track.rss, strict=True)))
    start = time.monotonic()
    data = plot_data(tl)
    assert data is not None
    page = plot_html.render(data, "big")
    svg = plot_mpl.render(data, "svg", (1400, 800))
    assert time.monotonic() - start < 10
    points = json.loads(re.findall(rb'id="memagent-data">(.*?)</script>', page)[0])["processes"][0]["rss"]
    assert len(points) <= 4002 and max(points, key=lambda p: p[1]) == [T0 + 77_777 * 0.5, max(rss)]
    assert b'id="rss-7"' in svg


def test_the_highest_rss_and_gpu_peaks_are_coloured() -> None:
    """Ten by RSS peak and five by GPU peak are drawn in colour; the rest in grey."""
    tracks = {}
    for pid in range(1, 21):  # RSS peaks rise with the PID; GPU memory only for 1-6, falling with it
        tracks[(pid, T0)] = Track(pid=pid, start_time=T0, times=[T0], rss=[pid * MiB],
                                  vram=[(10 - pid) * GiB if pid <= 6 else None], peak_bytes=pid * MiB,
                                  peak_time=T0, vram_peak_bytes=(10 - pid) * GiB if pid <= 6 else None)
    data = plot_data(Timeline(first=T0, last=T0, tracks=tracks, sum_peaks=[(T0, 210 * MiB)]))
    assert data is not None
    coloured = {p.pid: p.colour for p in data.processes if p.colour is not None}
    assert sorted(coloured) == [1, 2, 3, 4, 5, *range(11, 21)]
    assert [coloured[pid] for pid in (20, 11, 5, 1)] == [0, 9, 10, 14]  # by RSS peak, highest first


# --------------------------------------------------------------------------- gaps and alert names


def _with_gap() -> Timeline:
    """Two stretches of samples at 0.5 s, the daemon stopped 10 minutes in between."""
    times = [T0 + i * 0.5 for i in range(100)] + [T0 + 650 + i * 0.5 for i in range(100)]
    rss = [200 * MiB] * 200
    track = Track(pid=7, start_time=T0, name="svc", times=times, rss=rss, vram=[None] * 200, peak_bytes=200 * MiB,
                  peak_time=T0)
    return Timeline(host="box", interval=0.5, first=T0, last=times[-1], tracks={track.key: track},
                    sum_peaks=list(zip(times, rss, strict=True)))


def test_a_gap_breaks_the_lines_instead_of_crossing_it() -> None:
    """A daemon stopped for 10 minutes: the line stops and starts again (issue 28: gaps were
    drawn as straight lines), in the data both renderers draw."""
    from memagent.recordings.plot_data import broken

    data = plot_data(_with_gap())
    assert data is not None and data.gap_seconds == 5.0
    _, ys = broken(data.processes[0].rss, data.gap_seconds)
    assert sum(y != y for y in ys) == 1  # one NaN, between the two stretches
    assert sum(y != y for y in broken(data.sum_peaks, data.gap_seconds)[1]) == 1
    assert broken([(T0, 1), (T0 + 1, 2)], data.gap_seconds) == ([T0, T0 + 1], [1.0, 2.0])
    page = plot_html.render(data, "gap")
    assert json.loads(re.findall(rb'id="memagent-data">(.*?)</script>', page)[0])["gap_seconds"] == 5.0


def test_close_alerts_are_labelled_once_not_on_top_of_each_other() -> None:
    from memagent.recordings.plot_data import AlertMark

    data = plot_data(_with_gap())
    assert data is not None
    span = data.last - data.first
    first = data.first + 0.1 * span
    at = [first, first + span / 600, first + span / 300, data.first + 0.5 * span, data.first + 0.9 * span]
    data.alerts = [AlertMark(i, t, "headroom", "warning", "firing", "m", None) for i, t in enumerate(at)]
    assert data.labelled_alerts() == [True, False, False, True, True]
    data.alerts.append(AlertMark(9, data.last, "headroom", "warning", "resolved", "m", None))
    assert data.labelled_alerts()[-1] is False  # a resolution is a dotted line, never a name
