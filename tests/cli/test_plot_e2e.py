"""``memagent plot`` on recordings a real daemon made: ``memagent record -o FILE`` (a client's
recording) and the daemon's own flight recorder (found through ``status``), of a real
process that allocates and frees. The plot's peak is the daemon's (``ls --json``).

Synchronisation: the recording's file is read until the subscription shows in it; the
daemon's samples are awaited on a subscribed client; the flight recorder, which writes a
batch about every second, is polled with a deadline."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import Daemon, MiB, Target, memagent_cli, poll, wait_sample

from memproto.frames import Attached
from memproto.recording import RecordingError, SegmentReader

SVG = "{http://www.w3.org/2000/svg}"
LABEL = "e2e-job"



def subscribed(path: Path) -> bool:
    """The recording holds its header and ``attached`` frames: ``record`` is subscribed."""
    try:
        with path.open("rb") as f:
            return any(isinstance(frame, Attached) for frame in SegmentReader(f, path.name))
    except (OSError, RecordingError):
        return False


def embedded(page: Path) -> Any:
    found = re.findall(r'<script type="application/json" id="memagent-data">(.*?)</script>', page.read_text(), re.S)
    return json.loads(found[0])


def plotted(socket: str, out: Path, *args: str) -> dict[str, Any] | None:
    """The embedded data of ``plot ARGS -o out``, or None when it failed."""
    r = memagent_cli("plot", "--socket", socket, *args, "-o", str(out))
    return embedded(out) if r.returncode == 0 else None


def test_plot_of_a_real_daemons_recordings_shows_its_peak(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], tmp_path: Path
) -> None:
    d = start_daemon("--interval", "0.1", "--state-dir", str(tmp_path / "state"))
    t = make_target()
    assert memagent_cli("--socket", d.socket, "attach", str(t.pid), "--label", LABEL).returncode == 0
    rec = tmp_path / "run.mrec"
    recorder = subprocess.Popen([sys.executable, "-m", "memagent.cli", "record", "--socket", d.socket, "-o",
                                 str(rec), "--duration", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        poll("memagent record subscribed", lambda: subscribed(rec))
        with d.client() as c:
            c.subscribe()
            t.do("alloc 200")
            wait_sample(c, t.pid, lambda row: int(row["rss_bytes"]) >= 200 * MiB)  # type: ignore[call-overload]
            t.do("free")
            wait_sample(c, t.pid, lambda row: int(row["rss_bytes"]) < 100 * MiB)  # type: ignore[call-overload]
        recorder.send_signal(signal.SIGTERM)
        _, err = recorder.communicate(timeout=15)
        assert recorder.returncode == 0, err
    finally:
        if recorder.poll() is None:
            recorder.kill()
            recorder.wait(10)
    ls = json.loads(memagent_cli("--socket", d.socket, "ls", "--json").stdout)
    peak = next(p["rss_peak_bytes"] for p in ls if p["pid"] == t.pid)
    assert peak >= 200 * MiB

    # The client's recording: the process by its label, its peak the daemon's, the drop after it.
    data = plotted(d.socket, tmp_path / "run.html", str(rec))
    assert data is not None
    (proc,) = data["processes"]
    assert (proc["pid"], proc["title"], proc["peak_bytes"]) == (t.pid, LABEL, peak)
    values = [b for _, b in proc["rss"]]
    top = values.index(max(values))
    assert max(values) >= 200 * MiB and min(values[top:]) < 100 * MiB
    assert data["capacity_bytes"] and data["sum_peaks"][-1][1] == peak

    # The daemon's flight recorder, found through status (no FILE): the same peak, once written.
    latest = poll("the flight recorder holds the peak", lambda: (
        (found := plotted(d.socket, tmp_path / "flight.html", "--pid", str(t.pid))) is not None
        and found["processes"][0]["peak_bytes"] == peak and found))
    assert latest["processes"][0]["title"] == LABEL
    svg = tmp_path / "flight.svg"
    r = memagent_cli("plot", "--socket", d.socket, "--label", LABEL, "-o", str(svg), "--json")
    assert r.returncode == 0, r.stderr
    ids = {g.attrib.get("id") for g in ET.parse(svg).getroot().iter(f"{SVG}g")}
    assert {f"rss-{t.pid}", f"peak-{t.pid}", "sum-peaks"} <= ids
    assert json.loads(r.stdout)["processes"] == 1
