"""``memagent history`` against real daemons and real targets: from the daemon's RAM (the
same peak as ``ls``), from the flight recorder when the RAM does not reach back (a short
``--history``, a daemon SIGKILLed and started again), CSV; and hostile arguments of
``history``, ``record`` and ``report``, each one line and the documented exit code.

Synchronisation: samples awaited on a subscribed client, the recorder polled through the
command itself with a deadline.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, MiB, Target, memagent_cli, poll, wait_sample

from memproto.frames import Sample


def history_json(d: Daemon, *args: str) -> Any:
    r = memagent_cli("--socket", d.socket, "history", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wait_ticks(d: Daemon, pid: int, seconds: float) -> None:
    """Until the daemon has sampled ``pid`` for ``seconds`` more (its own clock)."""
    with d.client() as c:
        c.subscribe()
        wait_sample(c, pid, lambda r: True)
        start = next(f.time for f in c.stream() if isinstance(f, Sample))
        for f in c.stream():
            if isinstance(f, Sample) and f.time >= start + seconds:
                return


def test_history_from_ram_matches_ls_and_picks_by_label(
        daemon: Daemon, make_target: Callable[..., Target]) -> None:
    model, other = make_target(), make_target()
    model.do("alloc 100")
    with daemon.client() as c:
        c.attach([model.pid], label="model")
        c.attach([other.pid])
        c.subscribe()
        wait_sample(c, model.pid, lambda r: r["rss_peak_bytes"] >= 100 * MiB)
    (h,) = history_json(daemon, "--label", "model")
    ls = {p["pid"]: p for p in json.loads(memagent_cli("--socket", daemon.socket, "ls", "--json").stdout)}
    assert (h["pid"], h["label"], h["source"], h["step"]) == (model.pid, "model", "ram", 1.0)
    assert (h["rss_peak_bytes"], h["rss_peak_exact"]) == (ls[model.pid]["rss_peak_bytes"], True)
    # The highest slot is the sampled RSS: the kernel's mark, within what the allocation's own overhead adds.
    assert 0.97 * ls[model.pid]["rss_peak_bytes"] <= h["peak_bytes"] <= ls[model.pid]["rss_peak_bytes"]
    assert h["peak_time"] in [p[0] for p in h["points"]]
    assert all(t % 1.0 == 0 and vram is None for t, _, vram in h["points"])  # slots aligned on the step
    # No PID and no label: every process with points; by PID: that one.
    assert {p["pid"] for p in history_json(daemon)} == {model.pid, other.pid}
    assert [p["pid"] for p in history_json(daemon, str(other.pid))] == [other.pid]
    # CSV parses; text names its source.
    r = memagent_cli("--socket", daemon.socket, "history", str(model.pid), "--csv")
    rows = list(csv.reader(io.StringIO(r.stdout)))
    assert rows[0] == ["time", "pid", "start_time", "label", "rss_bytes", "vram_bytes"]
    assert rows[1:] and all(row[1] == str(model.pid) and row[3] == "model" and int(row[4]) > 0 for row in rows[1:])
    text = memagent_cli("--socket", daemon.socket, "history", str(model.pid)).stdout.splitlines()
    assert text[0] == f"source: the daemon's RAM ({daemon.socket})" and text[1].startswith(f"{model.pid} (model): ")
    # A PID not watched: one line, exit 1, the others still shown.
    r = memagent_cli("--socket", daemon.socket, "history", str(model.pid), "4000000", "--json")
    assert r.returncode == 1 and r.stderr == "memagent history: not watched: 4000000\n"
    assert [p["pid"] for p in json.loads(r.stdout)["history"]] == [model.pid]


def test_history_reads_the_recorder_where_ram_does_not_reach_back(
        start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], tmp_path: Path) -> None:
    """A daemon that keeps 1 s in RAM: ``--since 1m`` comes from its flight recorder; then
    SIGKILLed and started again on its state directory, the points from before the restart
    are still there (RAM starts afresh)."""
    state = tmp_path / "state"
    d = start_daemon("--interval", "0.1", "--history", "1", "--state-dir", str(state))
    t = make_target()
    t.do("alloc 30")
    with d.client() as c:
        c.attach([t.pid], label="job")
    wait_ticks(d, t.pid, 2.5)
    ram = history_json(d, str(t.pid))
    assert ram[0]["source"] == "ram" and len(ram[0]["points"]) <= 2  # no --since: what RAM holds
    (rec,) = poll("2 s of points in the recorder", lambda: [
        p for p in history_json(d, str(t.pid), "--since", "1m")
        if p["points"][-1][0] - p["points"][0][0] >= 2.0])
    assert rec["source"] == "recording" and rec["step"] == 0.1 and rec["label"] == "job"
    assert history_json(d, str(t.pid), "--since", "1m", "--from", "ram")[0]["source"] == "ram"
    before_kill = rec["points"][0][0]
    d.proc.kill()
    d.proc.wait(10)
    d2 = start_daemon("--interval", "0.1", "--history", "1", "--state-dir", str(state))
    wait_ticks(d2, t.pid, 0.3)
    (after,) = poll("the new segment read too", lambda: [
        p for p in history_json(d2, str(t.pid), "--since", "1m") if p["points"][-1][0] > time.time() - 1.5])
    assert after["source"] == "recording" and after["points"][0][0] == before_kill
    r = memagent_cli("--socket", d2.socket, "history", str(t.pid), "--since", "1m")
    assert r.stdout.startswith("source: the daemon's flight recorder (2 segments, host ")


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["history", "1", "--since", "nan"], 2, "memagent history: --since: not a time: 'nan'"),
    (["history", "1", "--since", "1e999"], 2, "memagent history: --since: not a time: '1e999'"),
    (["history", "1", "--since", "@1e300"], 2, "before 1970 or after the year 9999"),
    (["history", "1", "--since", "1h", "--until", "2h"], 2, "memagent history: --until is before --since"),
    (["history", "0"], 2, "not a PID: '0'"),
    (["history", "1", "--csv", "--json"], 2, "--csv and --json: choose one"),
    (["history", "1", "--file", "/nonexistent/x.mrec"], 1, "memagent history: no recording at /nonexistent/x.mrec"),
    (["history", "1", "--file", "/etc/passwd"], 1, "/etc/passwd: not a memagent recording"),
    (["record", "-o", "/tmp"], 1, "memagent record: cannot write /tmp: it is a directory"),
    (["record", "-o", "{tmp}/x.mrec", "--duration", "-1"], 2, "not a finite number of seconds above 0: '-1'"),
    (["record", "-o", "{tmp}/x.mrec", "--duration", "inf"], 2, "not a finite number of seconds above 0: 'inf'"),
    (["record", "-o", "{tmp}/x.mrec", "--pid", "0"], 2, "not a PID: '0'"),
    (["record", "-o", "{tmp}/x.mrec"], 2, "no memagent daemon at {tmp}/none.sock"),
    (["report", "/nonexistent"], 1, "memagent report: no recording at /nonexistent"),
    (["report", "/etc/passwd", "--since", "2h"], 1, "memagent report: /etc/passwd: not a memagent recording"),
    (["report", "--top", "-3", "/etc/passwd"], 2, "not a count from 1 to 100000: '-3'"),
    (["report", "/etc/passwd", "--until", "soon"], 2, "memagent report: --until: not a time: 'soon'"),
])
def test_hostile_arguments_are_one_line(tmp_path: Path, argv: list[str], code: int, message: str) -> None:
    """Refused before any daemon is asked (none listens at the socket given)."""
    r = memagent_cli("--socket", f"{tmp_path}/none.sock", *(a.format(tmp=tmp_path) for a in argv), "--json")
    assert r.returncode == code, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and message.format(tmp=tmp_path) in lines[0] and "Traceback" not in r.stderr
    assert json.loads(r.stdout)["error"]["message"] in lines[0]
    assert not (tmp_path / "x.mrec").exists()
