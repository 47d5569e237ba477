"""The gate's pure halves, without a process or a socket: would it fit (``fits``), the
run's verdict and exit status (``run.exit_status``), its outputs (summary, JSON, JUnit,
the step summary) and what the stream of frames says while CMD runs (``run.Watch``)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from memagent.client import Client
from memagent.errors import CommandFailed
from memagent.gate.fits import CANNOT_TELL, HOST, FitVerdict, Need, admission, judge, summary
from memagent.gate.outputs import (
    BAD_REPORT,
    Outcome,
    ProcessPeak,
    RunBudget,
    failures,
    junit_xml,
    markdown,
    read_report,
    report_json,
    summary_lines,
    xml_attr,
    xml_text,
)
from memagent.gate.run import Watch, exit_status
from memproto.frames import Attached, Exited, Sample
from memproto.records import SAMPLE_COLUMNS, Contributor, DaemonStatus, GpuInfo, Headroom, ProcessInfo

MiB = 1024 * 1024
GiB = 1024 * MiB
T0 = 1_764_511_200.0


def headroom(resource: str, capacity: int, watched: int, top: list[Contributor] | None = None) -> Headroom:
    return Headroom(resource=resource, name=resource, capacity_bytes=capacity, sum_peaks_bytes=watched,
                    ratio=watched / capacity, limit_bytes=capacity, reserve_bytes=0, unwatched_bytes=0,
                    top=top or [], configured=False)


def outcome(peaks: list[int], *, status: int = 0, exec_error: str | None = None, killed: bool = False,
            fits: list[FitVerdict] | None = None) -> Outcome:
    processes = [ProcessPeak(100 + i, ["python", "train.py"], peak, True, None) for i, peak in enumerate(peaks)]
    return Outcome(["python", "train.py"], status, 2.5, sum(peaks), processes, [], exec_error, killed, fits)


# --------------------------------------------------------------------------- fits


def test_a_need_fits_beside_what_is_watched_and_its_own_part_counts_once() -> None:
    room = [headroom(HOST, 16 * GiB, 10 * GiB, [Contributor(7, "big", 8 * GiB)])]
    ok, = judge([Need(HOST, 4 * GiB)], room)
    assert ok.fits and ok.total_bytes == 14 * GiB and ok.over_bytes <= 0
    over, = judge([Need(HOST, 8 * GiB)], room)
    assert not over.fits and over.over_bytes == 2 * GiB
    assert summary([over])[1] == "  heaviest watched there: PID 7 big 8.00 GiB"
    # the run's own processes the daemon watches too: taken out of its Σ, not counted twice
    own, = judge([Need(HOST, 8 * GiB)], room, {HOST: 3 * GiB})
    assert own.fits and own.watched_bytes == 7 * GiB


def test_both_bounds_are_judged_and_the_basis_picks_the_one_that_decides() -> None:
    """Σ peaks 700 MiB, seen together at most 400, of 1 GiB: 500 MiB more fits only on the
    observed bound; an observed figure above Σ peaks (a process detached since) is capped."""
    from memagent.gate import OBSERVED, WORST_CASE
    from memagent.gate.fits import bounds_json, decides

    h = replace(headroom(HOST, 1024 * MiB, 700 * MiB), observed_sum_max_bytes=400 * MiB)
    (v,) = judge([Need(HOST, 500 * MiB)], [h])
    assert (v.fits, v.observed().fits, v.observed().watched_bytes) == (False, True, 400 * MiB)
    assert (decides([v], WORST_CASE), decides([v], OBSERVED)) == (False, True)
    both = bounds_json([v], [v])
    assert both["worst_case"]["fits"] is False and both["observed"]["fits"] is True
    assert both["observed"]["resources"][0]["watched_observed_bytes"] == 400 * MiB
    assert "seen together 400 MiB" in v.observed().line()
    (capped,) = judge([Need(HOST, 1)], [replace(h, observed_sum_max_bytes=900 * MiB)])
    assert capped.observed().watched_bytes == 700 * MiB
    (older,) = judge([Need(HOST, 1)], [headroom(HOST, 1024 * MiB, 700 * MiB)])  # a 1.8 daemon: cannot tell
    assert older.observed().capacity_bytes is None and not decides([older], OBSERVED)


def test_a_resource_the_daemon_has_no_figure_for_cannot_be_said_to_fit() -> None:
    unknown, = judge([Need("GPU-1234", GiB)], [headroom(HOST, 16 * GiB, 0)])
    assert unknown.capacity_bytes is None and not unknown.fits
    assert failures(outcome([MiB], fits=[unknown]), RunBudget(None, None, False)) == [
        "would it fit here? cannot tell for GPU-1234"]


# --------------------------------------------------------------------------- the verdict


def test_over_budget_gives_the_over_budget_status_within_gives_cmds_own() -> None:
    budget = RunBudget(rss=GiB, vram=None, per_process=False)
    assert exit_status(outcome([300 * MiB, 300 * MiB], status=7), budget, 3) == 7
    assert exit_status(outcome([700 * MiB, 700 * MiB], status=0), budget, 3) == 3
    assert exit_status(outcome([700 * MiB, 700 * MiB], status=0), budget, 42) == 42


def test_per_process_budget_judges_each_process_not_the_sum() -> None:
    budget = RunBudget(rss=GiB, vram=None, per_process=True)
    assert exit_status(outcome([700 * MiB, 700 * MiB]), budget, 3) == 0
    assert failures(outcome([700 * MiB, 2 * GiB]), budget) == ["PID 101 RSS peak 2.00 GiB is 1.00 GiB over 1.00 GiB"]


def test_a_command_that_cannot_run_keeps_its_status_and_a_killed_tree_fails() -> None:
    budget = RunBudget(rss=MiB, vram=None, per_process=False)
    assert exit_status(outcome([GiB], status=127, exec_error="not found"), budget, 3) == 127
    assert exit_status(outcome([], status=137, killed=True), RunBudget(None, None, False), 3) == 3


def test_would_not_fit_fails_the_run_even_within_budget() -> None:
    verdict = FitVerdict(HOST, "host", 8 * GiB, 16 * GiB, 10 * GiB)
    run = outcome([100 * MiB], fits=[verdict])
    assert failures(run, RunBudget(None, None, False)) == ["would not fit here: host 2.00 GiB over"]
    assert exit_status(run, RunBudget(None, None, False), 3) == 3


# --------------------------------------------------------------------------- the outputs


def test_report_json_junit_and_step_summary_say_the_same_verdict() -> None:
    budget = RunBudget(rss=GiB, vram=None, per_process=False)
    run = outcome([700 * MiB, 700 * MiB])
    report = report_json(run, budget, 3)
    json.dumps(report)  # JSON as it is written
    assert report["over_budget"] is True and report["exit_status"] == 3
    assert report["rss_peak_bytes"] == 1400 * MiB and [p["pid"] for p in report["processes"]] == [100, 101]
    suite = ET.fromstring(junit_xml(run, budget, 3))
    assert suite.get("failures") == "1"
    failure = suite.find("testcase/failure")
    assert failure is not None and "over 1.00 GiB" in (failure.get("message") or "")
    assert markdown(run, budget, 3).startswith("### memagent run: ❌ over budget")
    within = outcome([100 * MiB])
    assert ET.fromstring(junit_xml(within, budget, 0)).get("failures") == "0"
    assert "✅ within budget" in markdown(within, budget, 0)


@pytest.mark.parametrize("text", ["plain", "a & b < c > d", 'say "hi"', "it's", "both ' and \"", "tab\there\nline\r",
                                  "]]> &amp; é \x7f"])
def test_the_junit_escapes_are_saxutils_own(text: str) -> None:
    """The JUnit file's escapes replace ``xml.sax.saxutils``'s (whose import pulls in
    ``urllib.request``: a third of a run's own start-up, issue 26) character for character,
    and a command line of every kind of quote reads back whole."""
    from xml.sax.saxutils import escape, quoteattr

    assert xml_text(text) == escape(text)
    assert xml_attr(text) == quoteattr(text)
    run = replace(outcome([100 * MiB]), command=["python", "-c", text])
    case = ET.fromstring(junit_xml(run, RunBudget(rss=MiB, vram=None, per_process=False), 3)).find("testcase")
    assert case is not None and case.get("name") == f"python -c {text}"


def test_an_over_budget_run_keeps_the_commands_own_exit_status_everywhere() -> None:
    """The run exits 3, the command itself 0: both are told (issue 28: the step summary
    said the command "exited 3", and --report had no field for its own status)."""
    budget = RunBudget(rss=GiB, vram=None, per_process=False)
    run = outcome([700 * MiB, 700 * MiB])
    assert run.status == 0
    report = report_json(run, budget, 3)
    assert (report["exit_status"], report["command_exit_status"]) == (3, 0)
    summary = markdown(run, budget, 3)
    assert "exited 0 after" in summary and "memagent run exited 3" in summary
    assert "the command itself exited 0" in summary_lines(run, budget, 3)[0]
    within = outcome([100 * MiB])
    assert "memagent run exited" not in markdown(within, budget, 0)
    assert "itself" not in summary_lines(within, budget, 0)[0]


# --------------------------------------------------------------------------- the watch


def process(pid: int, rss: int) -> ProcessInfo:
    return ProcessInfo(pid=pid, start_time=T0, name="python", cmdline=["python"], label="run", uid=0, alive=True,
                       attached_at=T0, exited_at=None, rss_bytes=rss, rss_peak_bytes=rss, anon_bytes=rss,
                       swap_bytes=0)


def sample(seq: int, rows: list[tuple[int, bool, int, int | None]]) -> Sample:
    """A tick in the agent's columns: (pid, alive, RSS peak, VRAM peak) per row."""
    return Sample(seq, T0 + seq, 0.1, list(SAMPLE_COLUMNS),
                  [[pid, T0, alive, peak, peak, peak, 0, vram, vram, True, None] for pid, alive, peak, vram in rows])


def test_the_watch_follows_the_tree_its_peaks_and_who_is_alive() -> None:
    # The watch asks the client only for stacks and status; these frames need neither.
    watch = Watch(cast(Client, None), RunBudget(rss=GiB, vram=None, per_process=False), None)
    watch.on_frame(Attached(process(10, 100 * MiB)))
    watch.on_frame(sample(1, [(10, True, 600 * MiB, None), (11, True, 300 * MiB, 2 * GiB)]))
    assert watch.tree == {10, 11} and watch.alive == {10, 11} and watch.samples == 1
    assert not watch.raw_over()
    watch.on_frame(sample(2, [(10, True, 500 * MiB, None), (11, False, 500 * MiB, None)]))
    assert watch.peaks == {(10, T0): 600 * MiB, (11, T0): 500 * MiB} and watch.vram == {(11, T0): 2 * GiB}
    assert watch.alive == {10} and watch.raw_over()  # 1.1 GiB of raw peaks over 1 GiB
    watch.on_frame(Exited(10, T0, T0 + 3, 700 * MiB))
    assert (10, T0) in watch.exited and watch.alive == set() and watch.peaks[(10, T0)] == 700 * MiB


def test_the_watch_counts_a_reused_pid_as_a_second_process() -> None:
    """PID 10 exits at 600 MiB and the kernel gives its number to a new process of the
    tree: two processes, 600 + 500 MiB of raw peaks (a PID-keyed max said 600 MiB)."""
    watch = Watch(cast(Client, None), RunBudget(rss=GiB, vram=None, per_process=False), None)
    watch.on_frame(sample(1, [(10, True, 600 * MiB, None)]))
    watch.on_frame(Exited(10, T0, T0 + 2, 600 * MiB))
    assert not watch.raw_over()
    reused = T0 + 2.5
    watch.on_frame(Attached(replace(process(10, 100 * MiB), start_time=reused)))
    watch.on_frame(Sample(3, T0 + 3, 0.1, list(SAMPLE_COLUMNS), [
        [10, T0, False, 600 * MiB, 600 * MiB, 0, 0, None, None, True, None],
        [10, reused, True, 500 * MiB, 500 * MiB, 0, 0, None, None, True, None]]))
    assert watch.peaks == {(10, T0): 600 * MiB, (10, reused): 500 * MiB}
    assert watch.tree == {10} and watch.alive == {10} and watch.exited == {(10, T0)}
    assert watch.raw_over()  # 1.1 GiB over 1 GiB


def test_the_watch_judges_raw_peaks_per_process_and_on_vram() -> None:
    per_process = Watch(cast(Client, None), RunBudget(rss=GiB, vram=None, per_process=True), None)
    per_process.on_frame(sample(1, [(10, True, 600 * MiB, None), (11, True, 600 * MiB, None)]))
    assert not per_process.raw_over()
    vram = Watch(cast(Client, None), RunBudget(rss=None, vram=GiB, per_process=False), None)
    vram.on_frame(sample(1, [(10, True, MiB, 600 * MiB), (11, True, MiB, 600 * MiB)]))
    assert vram.raw_over()


# --------------------------------------------------------------------------- admit: the judgement, the report read back


def status_of(room: list[Headroom], gpus: list[GpuInfo], gpu_note: str | None = None) -> DaemonStatus:
    """The parts of a daemon's status ``admission`` reads."""
    return cast(DaemonStatus, SimpleNamespace(headroom=room, gpus=gpus, gpu_note=gpu_note))


def test_admission_judges_the_host_and_the_gpu_asked_for_else_the_roomiest() -> None:
    gpus = [GpuInfo(0, "A", "GPU-a", 80 * GiB, 70 * GiB), GpuInfo(1, "B", "GPU-b", 80 * GiB, 10 * GiB)]
    room = [headroom(HOST, 16 * GiB, 10 * GiB), headroom("GPU-a", 80 * GiB, 70 * GiB),
            headroom("GPU-b", 80 * GiB, 10 * GiB)]
    judged, chosen, gpu = admission(status_of(room, gpus), 4 * GiB, 20 * GiB, None)
    assert gpu == "GPU-b" and [v.resource for v in judged] == [HOST, "GPU-b", "GPU-a"]
    assert [v.resource for v in chosen] == [HOST, "GPU-b"] and all(v.fits for v in chosen)
    _, chosen, gpu = admission(status_of(room, gpus), 4 * GiB, 20 * GiB, "0")
    assert gpu == "GPU-a" and [v.fits for v in chosen] == [True, False]
    judged, chosen, gpu = admission(status_of(room, gpus), 4 * GiB, None, None)
    assert gpu is None and judged == chosen and len(chosen) == 1


def test_admission_that_cannot_judge_says_why() -> None:
    room = [headroom(HOST, 16 * GiB, 0)]
    with pytest.raises(CommandFailed, match=r"sees no GPU 3 \(it sees: none\)") as exc:
        admission(status_of(room, []), GiB, GiB, "3")
    assert exc.value.code == CANNOT_TELL
    with pytest.raises(CommandFailed, match=r"sees no GPU: cannot judge --vram \(no driver\)"):
        admission(status_of(room, [], "no driver"), GiB, GiB, None)
    with pytest.raises(CommandFailed, match=r"^host: cannot tell \(the daemon has no figure for it\)$"):
        admission(status_of([], []), GiB, None, None)


def test_a_run_report_is_read_back_for_its_peaks(tmp_path: Path) -> None:
    good = tmp_path / "run.json"
    good.write_text(json.dumps({"rss_peak_bytes": GiB, "vram_peak_bytes": None, "status": 0}))
    assert read_report(str(good)) == (GiB, None)
    for text in ("[]", '{"rss_peak_bytes": true}', '{"rss_peak_bytes": 1, "vram_peak_bytes": -1}', "{"):
        good.write_text(text)
        with pytest.raises(CommandFailed, match="not a memagent run report") as exc:
            read_report(str(good))
        assert exc.value.code == BAD_REPORT
    with pytest.raises(CommandFailed, match=r"cannot read .*missing\.json: "):
        read_report(str(tmp_path / "missing.json"))
