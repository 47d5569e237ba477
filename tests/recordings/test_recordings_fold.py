"""Reading a recording, without a file or a process: frames folded into a timeline
(``build_timeline``), the report's data of it (``analysis.report_json``), and the checks
of the writer's output path (``writer.check_output``, ``create``) on a real directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memagent.errors import CommandFailed
from memagent.recordings.analysis import alerts_json, report_json
from memagent.recordings.timeline import build_timeline
from memagent.recordings.writer import FILE_EXISTS, FILE_EXISTS_STATUS, check_output, create
from memproto.frames import AlertRaised, Attached, Exited, Frame, Sample
from memproto.recording import FORMAT_VERSION, SegmentHeader
from memproto.records import SAMPLE_COLUMNS, Alert, ProcessInfo

MiB = 1024 * 1024
GiB = 1024 * MiB
T0 = 1_764_511_200.0


def process(pid: int, label: str | None) -> ProcessInfo:
    return ProcessInfo(pid=pid, start_time=T0, name=f"p{pid}", cmdline=[f"p{pid}"], label=label, uid=0, alive=True,
                       attached_at=T0, exited_at=None, rss_bytes=MiB, rss_peak_bytes=MiB, anon_bytes=MiB,
                       swap_bytes=0)


def tick(i: int, rows: list[tuple[int, bool, int]]) -> Sample:
    """Tick ``i``: (pid, alive, RSS = its peak so far) per row."""
    return Sample(i, T0 + i, 1.0, list(SAMPLE_COLUMNS),
                  [[pid, T0, alive, rss, rss, rss, 0, None, None, True, None] for pid, alive, rss in rows])


def alert(n: int, i: int, severity: str, state: str) -> Alert:
    return Alert(id=n, kind="headroom", state=state, severity=severity, resource="host", value=0.9,
                 threshold=0.8, message=f"{severity} {state}", time=T0 + i, contributors=[], unit="ratio")


def frames() -> list[Frame]:
    """PID 1 (``train``) rises to 3 GiB at tick 3 then falls; PID 2 exits after tick 2."""
    header = SegmentHeader(format=FORMAT_VERSION, host="box", start_time=T0, interval=1.0, version=[1, 0],
                           software="test", source="client", mem_total_bytes=8 * GiB)
    rss = [GiB, 2 * GiB, 2 * GiB, 3 * GiB, GiB]
    out: list[Frame] = [header, Attached(process(1, "train")), Attached(process(2, None))]
    for i in range(len(rss)):
        peak = max(rss[: i + 1])
        out.append(tick(i, [(1, True, peak), (2, i < 3, 100 * MiB)]))
        if i == 3:
            out.append(Exited(2, T0, T0 + i, 100 * MiB))
    out += [AlertRaised(alert(7, 2, "warning", "firing")), AlertRaised(alert(7, 3, "critical", "firing")),
            AlertRaised(alert(7, 4, "warning", "resolved"))]
    return out


def test_the_fold_keeps_each_process_peak_and_the_highest_sum() -> None:
    tl = build_timeline(frames())
    assert tl.host == "box" and tl.segments == 1 and tl.capacity_bytes == 8 * GiB
    train = tl.tracks[(1, T0)]
    assert (train.label, train.peak_bytes, train.peak_time) == ("train", 3 * GiB, T0 + 3)
    assert tl.tracks[(2, T0)].exited_at == T0 + 3
    assert tl.highest_sum() == (T0 + 3, 3 * GiB)  # PID 2 had exited: not in that tick's Σ
    assert [t.pid for t in tl.by_peak()] == [1, 2]


def test_a_window_and_a_label_cut_the_timeline() -> None:
    tl = build_timeline(frames(), since=T0 + 1, until=T0 + 2, labels=["train"])
    assert list(tl.tracks) == [(1, T0)] and (tl.first, tl.last) == (T0 + 1, T0 + 2)
    assert tl.tracks[(1, T0)].peak_bytes == 2 * GiB


def test_the_report_data_names_the_peaks_the_sum_and_each_alert_once() -> None:
    tl = build_timeline(frames())
    r = report_json(tl, ["run.mrec"], top=1)
    assert r["processes_total"] == 2 and [p["pid"] for p in r["processes"]] == [1]
    assert r["processes"][0]["peak_before_window"] is False
    assert r["sum_peaks"] == {"bytes": 3 * GiB, "time": T0 + 3, "capacity_bytes": 8 * GiB, "ratio": 0.375,
                              "capacity_source": "ram", "ram_bytes": 8 * GiB,
                              "share_adjusted": False, "unadjusted_bytes": 3 * GiB}
    only, = r["alerts"]
    assert (only["severity"], only["state"], only["time"], only["last_time"]) == ("critical", "resolved", T0 + 2,
                                                                                  T0 + 4)
    assert alerts_json([]) == []


def test_the_writer_refuses_an_existing_file_and_a_directory(tmp_path: Path) -> None:
    out = tmp_path / "run.mrec"
    os.close(create(str(out), force=False))
    with pytest.raises(CommandFailed) as exists:
        check_output(str(out), force=False)
    assert (exists.value.code, exists.value.status) == (FILE_EXISTS, FILE_EXISTS_STATUS)
    with pytest.raises(CommandFailed):
        create(str(out), force=False)
    check_output(str(out), force=True)
    os.close(create(str(out), force=True))
    with pytest.raises(CommandFailed) as directory:
        check_output(str(tmp_path), force=True)
    assert directory.value.code == "cannot-write" and directory.value.status == 1


def test_the_capacity_the_daemon_judged_with_is_the_reports_and_the_plots() -> None:
    """A configured 4 GiB capacity on an 8 GiB box: the report and the plot judge Σ peaks
    against 4 GiB, say it is the configured one and give the RAM beside it (issue 28: the
    report said 8 GiB while the daemon's alerts in it said 4)."""
    from memagent.recordings.plot_data import plot_data
    from memagent.recordings.report_text import text_lines
    from memproto.recording import HeadroomSnapshot
    from memproto.records import Headroom, HostMemory

    host = Headroom(resource="host", name="host memory", capacity_bytes=4 * GiB, sum_peaks_bytes=3 * GiB, ratio=0.75,
                    limit_bytes=8 * GiB, reserve_bytes=0, unwatched_bytes=0, configured=True, top=[])
    snapshot = HeadroomSnapshot(T0 + 1, HostMemory(8 * GiB, 6 * GiB, 0, 0), [host])
    later = HeadroomSnapshot(T0 + 3, HostMemory(8 * GiB, 6 * GiB, 0, 0), [host])
    tl = build_timeline([*frames()[:4], snapshot, *frames()[4:], later])
    assert (tl.capacity_bytes, tl.capacity_configured, tl.ram_bytes) == (4 * GiB, True, 8 * GiB)
    r = report_json(tl, ["x.mrec"], 5)
    assert r["sum_peaks"]["capacity_bytes"] == 4 * GiB and r["sum_peaks"]["ratio"] == 0.75
    assert r["sum_peaks"]["capacity_source"] == "configured"
    # The Σ is the daemon's own (share-adjusted, its snapshot's), not the rows' raw sum.
    assert r["sum_peaks"]["share_adjusted"] is True and r["sum_peaks"]["bytes"] == 3 * GiB
    assert r["sum_peaks"]["unadjusted_bytes"] == 3 * GiB  # PID 1 alone at its peak (tick 3)
    line = next(x for x in text_lines(r) if x.startswith("highest Σ peaks"))
    assert "of 4.00 GiB configured capacity (75%; host RAM 8.00 GiB)" in line, line
    data = plot_data(tl)
    assert data is not None and data.show_capacity()
    assert data.capacity_words() == "capacity 4.00 GiB (configured; host RAM 8.00 GiB)"
    assert data.judged_sum_peaks == [(T0 + 1, 3 * GiB), (T0 + 3, 3 * GiB)] and len(data.sum_peaks) == 5


def test_a_recorded_range_folds_the_daemons_moments_as_the_daemon_does() -> None:
    """The observed bound from a recording (issue 30): each snapshot's total then, and the
    daemon's maximum where its moment is inside the range; the report lists the moments
    and which of the top processes peaked together (PID 1 and 2 never at once here)."""
    from memagent.recordings.report_text import text_lines
    from memproto.recording import HeadroomSnapshot
    from memproto.records import Contributor, Headroom, HostMemory

    def snap(i: int, now: int, seen: int, seen_at: int) -> HeadroomSnapshot:
        view = Headroom("host", "host memory", 4 * GiB, 3 * GiB, 0.75, 8 * GiB, 0, 0, True, [],
                        sum_now_bytes=now, now_top=[Contributor(1, "train", now)],
                        observed_sum_max_bytes=seen, observed_sum_max_at=T0 + seen_at,
                        observed_top=[Contributor(1, "train", seen)])
        return HeadroomSnapshot(T0 + i, HostMemory(8 * GiB, 4 * GiB, 0, 0), [view])

    base = frames()
    stream = [*base[:4], snap(1, GiB, GiB, 1), *base[4:6], snap(3, 2 * GiB, 3 * GiB, 2), *base[6:]]
    tl = build_timeline(stream)
    best = tl.highest_together().best["host"]
    assert (best.at, best.total) == (T0 + 2, 3 * GiB)  # the daemon's own maximum, at its moment
    r = report_json(tl, ["run.mrec"], top=2)
    (host,) = r["observed"]
    assert (host["bytes"], host["time"], host["sum_peaks_bytes"], host["ratio"]) == (3 * GiB, T0 + 2, 3 * GiB, 0.75)
    assert [m["bytes"] for m in r["together_moments"]] == [3 * GiB]  # one meeting: the others within 5 s
    (pair,) = r["peaks_together"]
    assert (pair["a"]["pid"], pair["b"]["pid"], pair["both_samples"]) == (1, 2, 0)
    assert any(line.startswith("seen together (observed: a lower bound") for line in text_lines(r))
    # A range after the maximum: only what the snapshots in it tell (never the daemon's earlier figure).
    late = build_timeline(stream, since=T0 + 2.5)
    assert late.highest_together().best["host"].total == 2 * GiB
    assert build_timeline(stream, labels=["train"]).together == {}  # a subset: the fleet's totals are not its own
