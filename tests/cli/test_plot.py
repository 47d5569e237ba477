"""``memagent plot`` (docs/cli.md, "plot"), the real command on recordings written with the
format's own writer (``plot_recording.py``). The checks read the data back out of the
files, never pixels: the SVG's series by their ids, mapped back through the axis the
file itself draws; the PNG's chunks; the HTML's embedded JSON against the recording."""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import sys
import sysconfig
import venv
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import memagent_cli
from plot_recording import (
    FLEET_ALERTS,
    IDLE,
    INTERVAL,
    LOADER,
    T0,
    TICKS,
    TRAINER,
    GiB,
    MiB,
    Written,
    write_fleet,
    write_recording,
)
from plot_recording import fleet as fleet_of

from memagent.recordings.plot_file import MISSING_MATPLOTLIB
from memagent.recordings.timeline import build_timeline
from memproto.recording import open_recording

pytestmark = pytest.mark.e2e  # every test here starts processes (tests/tiers.py)

SVG = "{http://www.w3.org/2000/svg}"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def plot(*args: str) -> subprocess.CompletedProcess[str]:
    return memagent_cli("plot", *args)


def one_json_line(r: subprocess.CompletedProcess[str]) -> Any:
    assert r.stdout.count("\n") == 1, r.stdout
    return json.loads(r.stdout)


def error(r: subprocess.CompletedProcess[str], code: str, rc: int) -> str:
    """An error run: exit ``rc``, one line on stderr, the same error as JSON (``--json``)."""
    assert r.returncode == rc, r
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    doc = one_json_line(r)
    assert doc["error"]["code"] == code and doc["error"]["pid"] is None, doc
    assert doc["error"]["message"] in r.stderr
    return str(doc["error"]["message"])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Written:
    return write_fleet(tmp_path_factory.mktemp("plot") / "fleet.mrec")


# --------------------------------------------------------------------------- SVG: the series, mapped back


def _groups(svg: Path) -> dict[str, ET.Element]:
    root = ET.parse(svg).getroot()
    return {g.attrib["id"]: g for g in root.iter(f"{SVG}g") if "id" in g.attrib}


def _vertices(g: ET.Element) -> list[tuple[float, float]]:
    path = g.find(f"{SVG}path")
    assert path is not None
    return [(float(x), float(y)) for x, y in re.findall(r"[ML] (-?[\d.]+) (-?[\d.]+)", path.attrib["d"])]


def _marker(g: ET.Element) -> tuple[float, float]:
    use = next(g.iter(f"{SVG}use"))
    return float(use.attrib["x"]), float(use.attrib["y"])


class Axis:
    """``value -> SVG coordinate`` of a linear axis, from two known points."""

    def __init__(self, v0: float, c0: float, v1: float, c1: float) -> None:
        self.scale = (c1 - c0) / (v1 - v0)
        self.v0, self.c0 = v0, c0

    def __call__(self, v: float) -> float:
        return self.c0 + (v - self.v0) * self.scale


def test_svg_draws_every_series_where_the_data_puts_it(fleet: Written, tmp_path: Path) -> None:
    out = tmp_path / "fleet.svg"
    r = plot(str(fleet.path), "-o", str(out))
    assert r.returncode == 0, r.stderr
    g = _groups(out)

    # One vertex per sample: the trainer and the idle process all along, the loader until its exit.
    trainer, loader, idle = (_vertices(g[f"rss-{pid}"]) for pid in (TRAINER, LOADER, IDLE))
    assert (len(trainer), len(loader), len(idle)) == (TICKS, 40, TICKS)
    assert len(_vertices(g["sum-peaks"])) == TICKS
    # The axes, from the trainer's line: 100 MiB at T0 (its first point), 1 GiB at tick 30.
    y = Axis(100 * MiB, max(c for _, c in trainer), GiB, min(c for _, c in trainer))
    x = Axis(T0, trainer[0][0], T0 + (TICKS - 1) * INTERVAL, trainer[-1][0])
    assert min(trainer, key=lambda p: p[1])[0] == pytest.approx(x(T0 + 30 * INTERVAL), abs=0.01)
    # Every other series where its values put it on those axes.
    approx = lambda v: pytest.approx(v, abs=0.05)  # noqa: E731 - the SVG has 6 decimals
    assert [min(c for _, c in loader), max(c for _, c in loader)] == [approx(y(256 * MiB)), approx(y(100 * MiB))]
    assert all(c == approx(y(50 * MiB)) for _, c in idle)
    # The box's panel: Σ peaks from 250 MiB (tick 0) to 1330 MiB (ticks 30-39), and the capacity.
    sums = _vertices(g["sum-peaks"])
    assert [sums[0][0], sums[-1][0]] == [approx(x(T0)), approx(x(T0 + (TICKS - 1) * INTERVAL))]
    box = Axis(250 * MiB, sums[0][1], GiB + 256 * MiB + 50 * MiB, sums[30][1])
    assert min(c for _, c in sums) == approx(box(GiB + 256 * MiB + 50 * MiB))
    assert sums[40][1] == approx(box(GiB + 50 * MiB))  # the loader exited: its peak no longer counts
    assert [c for _, c in _vertices(g["capacity"])] == [approx(box(2 * GiB))] * 2
    # The peak markers: at the top of each line, at the time it was first reached.
    for pid, (peak, when) in fleet.peaks.items():
        assert _marker(g[f"peak-{pid}"]) == (approx(x(when)), approx(y(peak)))
    # The loader's exit, on its last value; the alerts at their times.
    assert _marker(g[f"exit-{LOADER}"]) == (approx(x(T0 + 40 * INTERVAL)), approx(y(150 * MiB)))
    for n, (tick, _) in enumerate(FLEET_ALERTS):
        assert [a for a, _ in _vertices(g[f"alert-{n}"])] == [approx(x(T0 + tick * INTERVAL))] * 2
    assert f"alert-{len(FLEET_ALERTS)}" not in g
    # GPU memory: only the trainer has some; its own panel, its peak at its top.
    assert f"vram-{LOADER}" not in g and f"vram-{IDLE}" not in g
    vram = _vertices(g[f"vram-{TRAINER}"])
    assert len(vram) == TICKS
    assert _marker(g[f"vram-peak-{TRAINER}"])[1] == approx(min(c for _, c in vram))
    # The words: each peak's value and time, the host in the title.
    words = [t.text or "" for t in ET.parse(out).getroot().iter(f"{SVG}text")]
    clock = dt.datetime.fromtimestamp(fleet.peaks[TRAINER][1]).strftime("%H:%M:%S")  # local time
    assert f"1.00 GiB at {clock}" in words and f"1.88 GiB at {clock}" in words, words  # RSS, GPU
    assert any("testbox" in w for w in words)


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    assert data[:8] == PNG_MAGIC
    chunks, at = [], 8
    while at < len(data):
        size = int.from_bytes(data[at:at + 4], "big")
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + size]
        assert int.from_bytes(data[at + 8 + size:at + 12 + size], "big") == zlib.crc32(kind + body), kind
        chunks.append((kind, body))
        at += 12 + size
    return chunks


def test_png_is_a_whole_png_of_the_size_asked(fleet: Written, tmp_path: Path) -> None:
    out = tmp_path / "fleet.png"
    r = plot(str(fleet.path), "-o", str(out), "--size", "1000x600", "--json")
    assert r.returncode == 0, r.stderr
    doc = one_json_line(r)
    assert doc == {"file": str(out), "format": "png", "processes": 3, "samples": TICKS, "first": doc["first"],
                   "last": doc["last"], "bytes": out.stat().st_size}
    chunks = _png_chunks(out.read_bytes())
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    ihdr = chunks[0][1]
    assert (int.from_bytes(ihdr[0:4], "big"), int.from_bytes(ihdr[4:8], "big")) == (1000, 600)


# --------------------------------------------------------------------------- HTML: the data, and nothing else


def embedded(html: str) -> Any:
    found = re.findall(r'<script type="application/json" id="memagent-data">(.*?)</script>', html, re.S)
    assert len(found) == 1
    return json.loads(found[0])


def test_html_embeds_the_recordings_series(fleet: Written, tmp_path: Path) -> None:
    out = tmp_path / "fleet.html"
    r = plot(str(fleet.path), "-o", str(out))
    assert r.returncode == 0, r.stderr
    data = embedded(out.read_text())
    tl = build_timeline(open_recording([str(fleet.path)]))
    assert [p["pid"] for p in data["processes"]] == [TRAINER, LOADER, IDLE]  # by peak
    for p in data["processes"]:
        track = tl.tracks[(p["pid"], p["start_time"])]
        assert p["rss"] == [[t, b] for t, b in zip(track.times, track.rss, strict=True)]
        assert p["vram"] == [[t, b] for t, b in zip(track.times, track.vram, strict=True) if b is not None]
        assert (p["peak_bytes"], p["peak_time"]) == fleet.peaks[p["pid"]] == (track.peak_bytes, track.peak_time)
        assert p["title"] == track.title and p["samples"] == len(track.times)
    assert [p["colour"] for p in data["processes"]] == [0, 1, 2]
    trainer = data["processes"][0]
    assert trainer["title"] == "trainer" and trainer["cmdline"] == ["python3", "train.py"]
    assert [b for _, b in trainer["vram"]][:3] == [0, 64 * MiB, 128 * MiB]
    assert data["sum_peaks"] == [list(s) for s in tl.sum_peaks] and len(data["sum_peaks"]) == TICKS
    assert data["capacity_bytes"] == 2 * GiB and data["capacity_shown"] is True
    assert [(a["id"], a["time"], a["kind"], a["state"], a["severity"]) for a in data["alerts"]] == [
        (a.id, a.time, a.kind, a.state, a.severity) for _, a in FLEET_ALERTS]
    assert data["exits"] == [{"pid": LOADER, "start_time": T0 - 100, "time": T0 + 40 * INTERVAL, "title": "loader"}]
    assert (data["host"], data["first"], data["last"]) == ("testbox", T0, T0 + (TICKS - 1) * INTERVAL)


HOSTILE = "</script><script>alert(1)</script>"


def test_html_is_offline_and_hostile_text_stays_text(tmp_path: Path) -> None:
    rec = tmp_path / "hostile.mrec"
    cmdline = ["python3", "-c", "x = '<!-- https://evil.example/a.js http://evil.example/ </SCRIPT>'", "\u2028"]
    write_recording(rec, fleet_of(label=HOSTILE, cmdline=cmdline), TICKS, host="http://evil.example/<b>")
    out = tmp_path / "hostile.html"
    r = plot(str(rec), "-o", str(out))
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert "http://" not in html.lower() and "https://" not in html.lower()
    assert html.count("<script") == 2 and html.lower().count("</script>") == 2 and "<!--" not in html
    data = embedded(html)
    assert data["host"] == "http://evil.example/<b>" and "<b>" not in html
    assert data["processes"][0]["label"] == data["processes"][0]["title"] == HOSTILE
    assert data["processes"][0]["cmdline"] == cmdline
    assert "innerHTML" not in html and "src=" not in html  # the page shows names as text, loads nothing


def test_svg_takes_hostile_labels_and_shows_local_time(tmp_path: Path) -> None:
    """A ``$`` would start matplotlib's mathtext (and an unbalanced one fail the drawing).
    Times are the wall clock of the zone the command runs in (here UTC+5:30)."""
    rec = tmp_path / "dollar.mrec"
    write_fleet(rec, label="$\\frac{$ <b>&amp;")
    out = tmp_path / "dollar.svg"
    r = memagent_cli("plot", str(rec), "-o", str(out), env={"TZ": "IST-5:30"})
    assert r.returncode == 0, r.stderr
    words = [t.text or "" for t in ET.parse(out).getroot().iter(f"{SVG}text")]
    assert any(w.startswith("$\\frac{$ <b>&amp; (4242) · peak 1.00 GiB at 19:30:15") for w in words), words
    assert "1.00 GiB at 19:30:15" in words  # T0 + 15 s is 14:00:15 UTC
    assert any(w.startswith("memagent · testbox · 2025-11-30 19:30:00 → 19:30:29") for w in words), words


# --------------------------------------------------------------------------- large recordings


def test_a_long_recording_is_decimated_and_keeps_its_peak(tmp_path: Path) -> None:
    from plot_recording import Proc, write_recording

    n, spike = 20_000, 12_345

    def rss(i: int) -> int:  # 100-106 MiB, and 1 GiB for one sample
        return GiB if i == spike else (100 + i % 7) * MiB

    rec = write_recording(tmp_path / "long.mrec", [Proc(7, "long", rss)], n, batch_every=500)
    out = tmp_path / "long.html"
    r = plot(str(rec.path), "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert one_json_line(r)["samples"] == n
    points = embedded(out.read_text())["processes"][0]["rss"]
    assert len(points) <= 4002 < n  # about two per pixel of width
    assert max(points, key=lambda p: p[1]) == [T0 + spike * INTERVAL, GiB]
    assert min(b for _, b in points) == 100 * MiB
    assert points[0][0] == T0 and points[-1][0] == T0 + (n - 1) * INTERVAL


# --------------------------------------------------------------------------- errors


def test_the_suffix_names_the_format(fleet: Written, tmp_path: Path) -> None:
    r = plot(str(fleet.path), "-o", str(tmp_path / "x.jpg"), "--json")
    assert "suffix names the format" in error(r, "usage", 2)
    assert not (tmp_path / "x.jpg").exists()


def test_unwritable_output_is_one_line_and_exit_1(fleet: Written, tmp_path: Path) -> None:
    message = error(plot(str(fleet.path), "-o", str(tmp_path / "missing" / "x.html"), "--json"), "cannot-write", 1)
    assert message == f"cannot write {tmp_path}/missing/x.html: no directory {tmp_path}/missing"
    error(plot(str(fleet.path), "-o", str(tmp_path), "--json"), "usage", 2)  # a directory has no suffix
    (tmp_path / "d.svg").mkdir()
    assert "is a directory" in error(plot(str(fleet.path), "-o", str(tmp_path / "d.svg"), "--json"),
                                     "cannot-write", 1)


def test_an_empty_window_writes_nothing(fleet: Written, tmp_path: Path) -> None:
    out = tmp_path / "empty.html"
    message = error(plot(str(fleet.path), "-o", str(out), "--since", f"@{T0 + 3600}", "--json"), "no-samples", 1)
    assert message.startswith("no samples in the recording window --since @") and not out.exists()
    message = error(plot(str(fleet.path), "-o", str(out), "--pid", "1", "--label", "nope", "--json"),
                    "no-samples", 1)
    assert message.startswith("no samples of PID 1 or label 'nope'") and not out.exists()
    missing = tmp_path / "nothing-here.mrec"
    assert error(plot(str(missing), "-o", str(out), "--json"), "no-recording", 1) == f"no recording at {missing}"
    garbage = tmp_path / "garbage.mrec"
    garbage.write_bytes(b"not a recording")
    assert "not a memagent recording" in error(plot(str(garbage), "-o", str(out), "--json"), "no-recording", 1)
    assert not out.exists()


def test_a_recording_cut_short_is_drawn_up_to_the_cut(fleet: Written, tmp_path: Path) -> None:
    """A recorder killed while writing: the damage is one line on stderr, the rest is drawn."""
    cut = tmp_path / "cut.mrec"
    whole = fleet.path.read_bytes()
    cut.write_bytes(whole[:len(whole) * 2 // 3])
    out = tmp_path / "cut.html"
    r = plot(str(cut), "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("\n") == 1 and "incomplete frame" in r.stderr and r.stderr.startswith("memagent plot: ")
    assert 0 < one_json_line(r)["samples"] < TICKS
    assert len(embedded(out.read_text())["sum_peaks"]) == one_json_line(r)["samples"]


def test_pid_and_label_choose_the_processes(fleet: Written, tmp_path: Path) -> None:
    out = tmp_path / "some.html"
    r = plot(str(fleet.path), "-o", str(out), "--label", "trainer", "--pid", str(IDLE))
    assert r.returncode == 0, r.stderr
    assert [p["pid"] for p in embedded(out.read_text())["processes"]] == [TRAINER, IDLE]


# --------------------------------------------------------------------------- without matplotlib


def python_without_matplotlib(where: Path) -> str:
    """A real interpreter on which matplotlib is not installed: a fresh virtual environment
    holding this one's packages (links to them, memagent's editable install included) but
    matplotlib's."""
    venv.create(where, with_pip=False, symlinks=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(where), "platbase": str(where)}))
    for entry in Path(sysconfig.get_path("purelib")).iterdir():
        if not entry.name.lower().startswith(("matplotlib", "mpl_toolkits", "pylab")):
            (site / entry.name).symlink_to(entry)
    return str(where / "bin" / "python")


def test_png_without_matplotlib_says_which_extra_in_one_line(fleet: Written, tmp_path: Path) -> None:
    python = python_without_matplotlib(tmp_path / "env")
    absent = subprocess.run([python, "-c", "import matplotlib"], capture_output=True, text=True)
    assert absent.returncode == 1 and "No module named 'matplotlib'" in absent.stderr
    for suffix in ("png", "svg"):
        out = tmp_path / f"x.{suffix}"
        r = subprocess.run([python, "-m", "memagent.cli", "plot", str(fleet.path), "-o", str(out)],
                           capture_output=True, text=True, timeout=30)
        assert (r.returncode, r.stderr, r.stdout) == (2, f"memagent plot: {MISSING_MATPLOTLIB}\n", ""), r
        assert not out.exists()
    out = tmp_path / "x.html"  # the same interpreter writes HTML: it needs nothing
    r = subprocess.run([python, "-m", "memagent.cli", "plot", str(fleet.path), "-o", str(out), "--json"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and json.loads(r.stdout)["format"] == "html", r
    assert sys.executable != python
