"""``memagent history --file`` and ``memagent report`` over a recording written here with the
format's own writer (as the daemon's recorder and ``memagent record`` write it), so that
every value, peak, alert and stack is known; and the time arguments they share
(``timeline.parse_when``, ``recorded.window``). The commands run in-process through
``main`` (the real entry point: parser, command, error reporting)."""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from memagent.cli.args import UsageError
from memagent.cli.main import main
from memagent.cli.recording_args import window
from memproto.frames import AlertRaised, Attached, Exited, Frame
from memproto.recording import FORMAT_VERSION, HeadroomSnapshot, PeakStack, SegmentHeader, SegmentWriter
from memproto.records import (
    SAMPLE_COLUMNS,
    Alert,
    HostMemory,
    ProcessInfo,
    StackDump,
    StackFrame,
    ThreadStack,
)
from memproto.version import PROTOCOL_MAJOR, PROTOCOL_MINOR
from memproto.when import parse_when

MiB = 1024 * 1024
GiB = 1024 * MiB
T0 = 1_764_511_200.0  # 2025-11-30 14:00:00 UTC
STEP = 0.5
TICKS = 20
PEAK_TICK = 10
EXIT_TICK = 15


def rss_a(i: int) -> int:
    """``train`` (PID 101): up to 500 MiB at tick 10, then 200 MiB."""
    return (100 + 40 * i) * MiB if i <= PEAK_TICK else 200 * MiB


def rss_b(i: int) -> int:
    return (50 + i) * MiB  # ``etl`` (PID 202): grows 1 MiB a tick until it exits at tick 15


def at(i: int) -> float:
    return T0 + i * STEP


def info(pid: int, name: str, label: str | None, rss: int) -> ProcessInfo:
    return ProcessInfo(pid=pid, start_time=T0 - 60, name=name, cmdline=[name, "--big"], label=label, uid=0,
                       alive=True, attached_at=T0 - 30, exited_at=None, rss_bytes=rss, rss_peak_bytes=rss,
                       anon_bytes=rss, swap_bytes=0)


def alert(n: int, i: int, kind: str, state: str, severity: str, pid: int | None = None) -> Alert:
    return Alert(id=n, kind=kind, state=state, severity=severity, resource="host" if pid is None else f"pid:{pid}",
                 value=0.9, threshold=0.8, message=f"{kind} {severity} {state}", time=at(i), contributors=[],
                 unit="ratio", pid=pid, source="kernel-log" if kind == "oom-kill" else None)


STACK = StackDump(time=at(PEAK_TICK), trigger="peak", rss_bytes=rss_a(PEAK_TICK), vram_bytes=None, threads=[
    ThreadStack(thread_id=1, name="MainThread", active=False, owns_gil=False,
                frames=[StackFrame("wait", "threading.py", 300)]),
    ThreadStack(thread_id=7, name="loader", active=True, owns_gil=True,
                frames=[StackFrame("alloc", "train.py", 42), StackFrame("step", "train.py", 10),
                        StackFrame("main", "train.py", 3)]),
], attributed_thread=7)


@dataclass
class Rec:
    path: Path
    #: pid -> [(time, rss, vram)] of every live sample written.
    points: dict[int, list[list[object]]]


def row(pid: int, alive: bool, rss: int, peak: int, vram: int | None = None, vpeak: int | None = None) -> list[object]:
    values = {"pid": pid, "start_time": T0 - 60, "alive": alive, "rss_bytes": rss, "rss_peak_bytes": peak,
              "anon_bytes": rss, "swap_bytes": 0, "vram_bytes": vram, "vram_peak_bytes": vpeak,
              "rss_peak_exact": True, "oom_score_adj": None}
    return [values[c] for c in SAMPLE_COLUMNS]


@pytest.fixture
def rec(tmp_path: Path) -> Rec:
    """Three processes over 20 ticks: one peaks at tick 10 (with a stack at its peak), one
    exits (OOM-killed) at tick 15, one idle on a GPU; a headroom alert fires, turns
    critical and resolves. A batch every 4 ticks (so a cut-short file loses only the last)."""
    w = SegmentWriter(SegmentHeader(format=FORMAT_VERSION, host="box", start_time=T0, interval=STEP,
                                    version=[PROTOCOL_MAJOR, PROTOCOL_MINOR], software="memagent test",
                                    source="client", mem_total_bytes=8 * GiB))
    out = bytearray(w.header_bytes())
    for p in (info(101, "python3", "train", rss_a(0)), info(202, "etl", None, rss_b(0)),
              info(303, "idle", None, 10 * MiB)):
        w.add(Attached(p))
    w.add(HeadroomSnapshot(T0, HostMemory(8 * GiB, 4 * GiB, 0, 0), []))
    points: dict[int, list[list[object]]] = {101: [], 202: [], 303: []}
    events: dict[int, list[Frame]] = {8: [AlertRaised(alert(1, 8, "headroom", "firing", "warning"))],
              9: [AlertRaised(alert(1, 9, "headroom", "firing", "critical"))],
              12: [AlertRaised(alert(1, 12, "headroom", "resolved", "critical"))],
              EXIT_TICK: [Exited(202, T0 - 60, at(EXIT_TICK), rss_b(EXIT_TICK - 1)),
                          AlertRaised(alert(2, EXIT_TICK, "oom-kill", "firing", "critical", pid=202))]}
    for i in range(TICKS):
        peak_a = max(rss_a(j) for j in range(i + 1))
        alive_b = i < EXIT_TICK
        b = rss_b(min(i, EXIT_TICK - 1))
        rows = [row(101, True, rss_a(i), peak_a), row(202, alive_b, b, b),
                row(303, True, 10 * MiB, 10 * MiB, GiB, 2 * GiB)]
        w.add_sample(i + 1, at(i), STEP, rows)
        points[101].append([at(i), rss_a(i), None])
        if alive_b:
            points[202].append([at(i), b, None])
        points[303].append([at(i), 10 * MiB, GiB])
        if i == PEAK_TICK:
            w.add(PeakStack(101, T0 - 60, STACK))
        for frame in events.get(i, []):
            w.add(frame)
        if i % 4 == 3:
            out += w.take()
    out += w.take()
    path = tmp_path / "run.mrec"
    path.write_bytes(bytes(out))
    return Rec(path, points)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, object, str]:
    code, out, err = run(capsys, *argv, "--json")
    return code, json.loads(out), err


# --------------------------------------------------------------------------- report


def test_report_lists_peaks_stack_sum_alerts_and_oom_kills(rec: Rec, capsys: pytest.CaptureFixture[str]) -> None:
    code, r, err = run_json(capsys, "report", str(rec.path))
    assert code == 0 and err == ""
    assert isinstance(r, dict)
    assert [p["pid"] for p in r["processes"]] == [101, 202, 303] and r["processes_total"] == 3
    a, b, c = r["processes"]
    assert (a["peak_bytes"], a["peak_time"], a["peak_exact"], a["peak_before_window"]) == \
        (500 * MiB, at(PEAK_TICK), True, False)
    assert (a["label"], a["cmdline"], a["exited_at"]) == ("train", ["python3", "--big"], None)
    # The stack at the peak: the attributed thread's frames, innermost first.
    assert a["stack"]["thread_name"] == "loader" and a["stack"]["time"] == at(PEAK_TICK)
    assert [f["name"] for f in a["stack"]["frames"]] == ["alloc", "step", "main"]
    assert (b["peak_bytes"], b["exited_at"], b["stack"]) == (rss_b(EXIT_TICK - 1), at(EXIT_TICK), None)
    assert (c["vram_peak_bytes"], c["peak_bytes"]) == (2 * GiB, 10 * MiB)
    # Σ peaks (of the live processes) is highest at B's last live tick: A's peak held, B at its highest.
    highest = 500 * MiB + rss_b(EXIT_TICK - 1) + 10 * MiB
    assert r["sum_peaks"] == {"bytes": highest, "time": at(EXIT_TICK - 1), "capacity_bytes": 8 * GiB,
                              "ratio": round(highest / (8 * GiB), 4), "capacity_source": "ram", "ram_bytes": 8 * GiB,
                              "share_adjusted": False, "unadjusted_bytes": highest}
    # One entry per alert: when it fired, its worst level, its last state; the OOM kill apart.
    (headroom,) = r["alerts"]
    assert {k: headroom[k] for k in ("id", "kind", "severity", "state", "time", "last_time")} == \
        {"id": 1, "kind": "headroom", "severity": "critical", "state": "resolved", "time": at(8), "last_time": at(12)}
    (oom,) = r["oom_kills"]
    assert (oom["pid"], oom["time"], oom["source"]) == (202, at(EXIT_TICK), "kernel-log")
    assert (r["samples"], r["first_time"], r["last_time"], r["host"]) == (TICKS, T0, at(TICKS - 1), "box")


def test_report_text_for_people(rec: Rec, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "report", str(rec.path), "--top", "2")
    assert code == 0
    assert "top 2 of 3 processes by peak:" in out
    assert "train" in out and "500 MiB" in out and "idle" not in out
    assert "alloc (train.py:42)" in out and "stack at the peak" in out
    assert "highest Σ peaks:" in out and "of 8.00 GiB RAM" in out  # no headroom snapshot: the RAM stands in
    assert "critical headroom [host] firing -> resolved" in out
    assert "OOM kills: 1" in out and "pid 202" in out


def test_report_window_and_filters(rec: Rec, capsys: pytest.CaptureFixture[str]) -> None:
    # From tick 12: A's peak (tick 10) came before the window; its time is the window's first sample.
    _, r, _ = run_json(capsys, "report", str(rec.path), "--since", f"@{at(12)}", "--top", "1")
    assert isinstance(r, dict)
    (a,) = r["processes"]
    assert (a["pid"], a["peak_bytes"], a["peak_time"], a["peak_before_window"]) == (101, 500 * MiB, at(12), True)
    assert r["processes_total"] == 3 and r["alerts"][0]["time"] == at(12)
    _, r, _ = run_json(capsys, "report", str(rec.path), "--pid", "202")
    assert isinstance(r, dict) and [p["pid"] for p in r["processes"]] == [202]
    _, r, _ = run_json(capsys, "report", str(rec.path), "--label", "train")
    assert isinstance(r, dict) and [p["pid"] for p in r["processes"]] == [101]
    # An empty window is an answer (exit 0); a PID with no samples is not (exit 1, one line).
    code, r, _ = run_json(capsys, "report", str(rec.path), "--since", f"@{at(TICKS + 10)}")
    assert code == 0 and isinstance(r, dict) and r["processes"] == [] and r["sum_peaks"] is None
    code, out, err = run(capsys, "report", str(rec.path), "--until", f"@{T0 - 10}")
    assert code == 0 and "nothing recorded in this window" in out
    code, r, err = run_json(capsys, "report", str(rec.path), "--pid", "999")
    assert code == 1 and isinstance(r, dict) and r["error"]["code"] == "no-samples"
    assert err == "memagent report: no samples of PID 999 in the recording\n"


def test_a_cut_short_recording_still_reports_with_one_damage_line(
        rec: Rec, capsys: pytest.CaptureFixture[str]) -> None:
    data = rec.path.read_bytes()
    rec.path.write_bytes(data[:-3])  # the last batch (ticks 16-19) is incomplete
    code, r, err = run_json(capsys, "report", str(rec.path))
    assert code == 0 and isinstance(r, dict)
    assert r["last_time"] == at(15) and r["processes"][0]["peak_bytes"] == 500 * MiB
    lines = err.splitlines()
    assert len(lines) == 1 and "incomplete frame" in lines[0] and lines[0].startswith("memagent report: ")
    assert len(r["damage"]) == 1


# --------------------------------------------------------------------------- history --file


def test_history_from_a_file_gives_the_samples_written(rec: Rec, capsys: pytest.CaptureFixture[str]) -> None:
    code, got, err = run_json(capsys, "history", "--file", str(rec.path))
    assert code == 0 and err == "" and isinstance(got, list)
    by_pid = {p["pid"]: p for p in got}
    assert set(by_pid) == {101, 202, 303}
    for pid, points in rec.points.items():
        assert by_pid[pid]["points"] == points
        assert by_pid[pid]["source"] == "recording" and by_pid[pid]["step"] == STEP
    a = by_pid[101]
    assert (a["peak_bytes"], a["peak_time"], a["rss_peak_bytes"], a["label"]) == (500 * MiB, at(PEAK_TICK), 500 * MiB,
                                                                                   "train")
    assert by_pid[202]["exited_at"] == at(EXIT_TICK)


def test_history_picks_by_pid_label_and_window(rec: Rec, capsys: pytest.CaptureFixture[str]) -> None:
    _, got, _ = run_json(capsys, "history", "--file", str(rec.path), "--label", "train", "303",
                         "--since", f"@{at(5)}", "--until", f"@{at(7)}")
    assert isinstance(got, list) and [p["pid"] for p in got] == [101, 303]
    assert got[0]["points"] == [[at(i), rss_a(i), None] for i in (5, 6, 7)]
    code, got, err = run_json(capsys, "history", "--file", str(rec.path), "101", "404")
    assert code == 1 and isinstance(got, dict)
    assert [p["pid"] for p in got["history"]] == [101]
    assert got["failures"] == [{"code": "no_such_process", "message": "not in the recording: 404", "pid": 404}]
    assert err == "memagent history: not in the recording: 404\n"


def test_history_csv_and_text(rec: Rec, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "history", "--file", str(rec.path), "--csv")
    assert code == 0
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == ["time", "pid", "start_time", "label", "rss_bytes", "vram_bytes"]
    assert len(rows) - 1 == sum(len(p) for p in rec.points.values())
    first_a = next(r for r in rows[1:] if r[1] == "101")
    assert (float(first_a[0]), first_a[3], int(first_a[4]), first_a[5]) == (T0, "train", rss_a(0), "")
    assert any(r[1] == "303" and r[5] == str(GiB) for r in rows[1:])
    code, out, _ = run(capsys, "history", "--file", str(rec.path), "303")
    lines = out.splitlines()
    assert lines[0].startswith(f"source: the recording at {rec.path} (1 segment, host box)")
    assert lines[1].startswith("303 (idle): peak 10.0 MiB") and "VRAM" in lines[2]
    assert len(lines) == 3 + TICKS


# --------------------------------------------------------------------------- times


def test_parse_when_forms() -> None:
    now = 1_000_000.0
    assert parse_when("90", now) == now - 90 and parse_when("30s", now) == now - 30
    assert parse_when("15m", now) == now - 900 and parse_when("2h", now) == now - 7200
    assert parse_when("1.5d", now) == now - 1.5 * 86400 and parse_when("1w", now) == now - 604800
    assert parse_when("@1764511200", now) == 1764511200.0
    assert parse_when("2026-11-30T14:00", now) == dt.datetime(2026, 11, 30, 14, 0).timestamp()
    assert parse_when("2026-11-30T14:00+00:00", now) == 1796047200.0
    for bad in ("nan", "1e999", "@nan", "@inf", "soon", "", "-5m"):
        with pytest.raises(ValueError, match="not a time"):
            parse_when(bad, now)


def test_window_refuses_backwards_and_out_of_range() -> None:
    def win(since: str | None, until: str | None) -> tuple[float | None, float | None]:
        return window(argparse.Namespace(since=since, until=until), "memagent report", now=1_000_000.0)

    assert win("2h", "1h") == (1_000_000.0 - 7200, 1_000_000.0 - 3600)
    assert win(None, None) == (None, None)
    with pytest.raises(UsageError, match="--until is before --since"):
        win("1h", "2h")
    for far in ("@1e300", "99999999999w", "@-5"):
        with pytest.raises(UsageError, match="before 1970 or after the year 9999"):
            win(far, None)


def test_a_pid_filter_cuts_the_timeline_to_that_process() -> None:
    """`plot --pid` of an early process must not span the hours after it (nor Σ peaks)."""
    import io

    from memagent.recordings.timeline import build_timeline
    from memproto.recording import FORMAT_VERSION, SegmentHeader, SegmentReader, SegmentWriter

    w = SegmentWriter(SegmentHeader(FORMAT_VERSION, "box", 1000.0, 1.0, [1, 6], "test"))
    out = io.BytesIO()
    out.write(w.header_bytes())
    for t in range(20):
        early = (7, 1.0, t < 5, 10 + t, 10 + t, 1, 0, None, None, True, None)
        late = (8, 2.0, True, 50, 50, 1, 0, None, None, True, None)
        w.add_sample(t + 1, 1000.0 + t, 1.0, [early, late])
    out.write(w.take())
    out.seek(0)
    from memproto.recording import Playback

    pb = Playback()
    reader = SegmentReader(out)
    frames = [pb.feed(reader.header), *(pb.feed(f) for f in reader)]
    tl = build_timeline(frames, pids=[7])
    assert (tl.first, tl.last) == (1000.0, 1005.0)  # alive 0-4, seen exited at 5
    assert [t for t, _ in tl.sum_peaks] == [1000.0 + t for t in range(6)]
    everyone = build_timeline(frames)
    assert (everyone.first, everyone.last) == (1000.0, 1019.0)
