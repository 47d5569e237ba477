"""What moved out of the commands into ``recordings/``, without a process: which source
``memagent history`` answers from when there is no daemon (``history.gather``), its text and
CSV rows, a recording's processes as histories (``of_timeline``), ``report``'s text and its
"no samples of" lines (``report_text``, ``analysis.missing_asked``), and ``plot``'s line
for a window with nothing to draw (``plot_file.nothing_line``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_recordings_fold import T0, GiB, frames

from memagent.errors import RecordingUnavailable
from memagent.recordings import RAM, RECORDING
from memagent.recordings.analysis import missing_asked, report_json
from memagent.recordings.history import ProcessHistory, Query, Result, csv_rows, gather, of_timeline, text_lines
from memagent.recordings.plot_file import nothing_line
from memagent.recordings.report_text import text_lines as report_lines
from memagent.recordings.timeline import Timeline, build_timeline
from memproto.client_side import DaemonNotRunning


def query(tmp_path: Path, origin: str = "auto", file: str | None = None, pids: tuple[int, ...] = ()) -> Query:
    """No daemon at the socket (a path where none listens)."""
    return Query(list(pids), [], None, None, False, origin, file, str(tmp_path / "no.sock"))


def history(pid: int, points: list[tuple[float, int, int | None]]) -> ProcessHistory:
    return ProcessHistory(pid, T0, f"p{pid}", None, RECORDING, 1.0, points, 2 * GiB, False)


def test_a_recording_is_read_when_asked_for_and_when_no_daemon_answers(tmp_path: Path) -> None:
    found = [history(1, [(T0, GiB, None)]), history(2, [])]
    for q in (query(tmp_path, RECORDING), query(tmp_path, file="x.mrec"), query(tmp_path)):
        r = gather(q, lambda: (found, "the recording"))
        assert (r.source, r.where, [p.pid for p in r.processes]) == (RECORDING, "the recording", [1])


def test_no_daemon_and_no_recording_is_the_daemons_error(tmp_path: Path) -> None:
    def unreadable() -> tuple[list[ProcessHistory], str]:
        raise RecordingUnavailable("no recording")

    with pytest.raises(DaemonNotRunning):
        gather(query(tmp_path), unreadable)
    with pytest.raises(DaemonNotRunning):  # --from ram: never the recording
        gather(query(tmp_path, RAM), lambda: ([], "unread"))


def test_a_pid_without_points_is_a_failure_and_the_text_and_csv_show_the_others(tmp_path: Path) -> None:
    r = gather(query(tmp_path, RECORDING, pids=(1, 3)), lambda: ([history(1, [(T0, GiB, 5)])], "rec"))
    assert [f.message for f in r.failures] == ["not in the recording: 3"]
    lines = text_lines(r)
    assert lines[0] == "source: rec" and lines[1].startswith("1 (p1): peak 1.00 GiB at ")
    assert "process peak 2.00 GiB~" in lines[1] and lines[2].split() == ["TIME", "RSS", "VRAM"]
    assert list(csv_rows(r)) == [(f"{T0:.3f}", 1, f"{T0:.2f}", "", GiB, 5)]
    assert text_lines(Result([], RAM, "ram"))[1] == "no process has points in this window"


def test_a_recordings_processes_as_histories_say_where_they_come_from() -> None:
    tl = build_timeline(frames())
    found, where = of_timeline(tl, None)
    assert where == "the daemon's flight recorder (1 segment, host box)"
    assert {p.pid: max(rss for _, rss, _ in p.points) for p in found} == {1: 3 * GiB, 2: 100 * 1024 * 1024}
    assert of_timeline(tl, "run.mrec")[1].startswith("the recording at run.mrec (")


def test_the_report_text_names_the_peak_and_what_was_asked_that_has_no_samples() -> None:
    tl = build_timeline(frames())
    lines = report_lines(report_json(tl, ["run.mrec"], top=1))
    assert lines[0].startswith("recording run.mrec: host box, 1 segment, ") and "(4 s, 5 samples)" in lines[0]
    assert lines[1] == "top 1 of 2 processes by peak:" and "3.00 GiB" in lines[3]
    assert "alerts: 1" in lines and "OOM kills: none" in lines
    assert report_lines(report_json(Timeline(), ["run.mrec"], top=1)) == [
        "recording run.mrec: nothing recorded in this window"]
    assert missing_asked(tl, [1, 9], ["train", "gone"]) == ["no samples of PID 9",
                                                           "no samples of a process labelled 'gone'"]


def test_nothing_to_plot_names_what_was_asked_and_the_window() -> None:
    assert nothing_line([], [], None, None) == "no samples in the recording; nothing written"
    assert nothing_line([7], ["x"], "2h", None) == ("no samples of PID 7 or label 'x' in the recording window "
                                                    "--since 2h; nothing written")
