"""memtop's data layer without a screen or a daemon: the filter, the growth window, and the
app's frame dispatch map (each frame type's effect on the model)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memproto.frames import (
    Ack,
    AlertRaised,
    Attached,
    AttachOk,
    Detached,
    DetachOk,
    Dropped,
    Error,
    Exited,
    Frame,
    HistoryOk,
    ListOk,
    ResetPeaksOk,
    Sample,
    StackOk,
    StackStateChanged,
    StatusOk,
    Subscribe,
)
from memproto.records import (
    SAMPLE_COLUMNS,
    SAMPLE_FIELDS,
    Alert,
    Container,
    DaemonStatus,
    Failure,
    HostMemory,
    ProcessInfo,
    ProcessRef,
    Series,
    TickStats,
)
from memproto.text import cut_cmdline
from memproto.vocabulary import AlertKind, AlertState, Severity, StackState
from memtop.app import MemtopApp
from memtop.model import GrowthWindow, ProcRow

MiB = 1024 * 1024
T0 = 1_800_000_000.0


# ---------------------------------------------------------------------- filter

ROW = ProcRow(4100, T0, "python3", "ResNet-train", ("python3", "train.py", "--epochs", "90"), 1000, True,
              MiB, MiB, MiB, 0, True, container="edge/detector-7c9f/yolo", unit="cri-containerd-3f1c.scope")


@pytest.mark.parametrize("needle", ["4100", "41", "PYTHON", "resnet", "Train", "--EPOCHS", "train.py --ep", "",
                                    "YOLO", "detector-7c9f", "cri-containerd"])
def test_filter_matches_pid_name_label_command_line_container_and_unit(needle: str) -> None:
    assert ROW.matches(needle)


@pytest.mark.parametrize("needle", ["4101", "bert", "python4", "epochs  90"])
def test_filter_rejects_what_is_not_there(needle: str) -> None:
    assert not ROW.matches(needle)


# ---------------------------------------------------------------------- growth window

def test_growth_is_the_slope_in_bytes_per_second() -> None:
    w = GrowthWindow()
    for t in range(11):
        w.add(T0 + t, (100 + 3 * t) * MiB)
    assert w.slope() == pytest.approx(3 * MiB)


def test_growth_needs_three_points_over_two_seconds() -> None:
    w = GrowthWindow(spacing=0.5)
    w.add(T0, 0)
    w.add(T0 + 0.5, MiB)
    assert w.slope() is None  # two points
    w.add(T0 + 1.0, 2 * MiB)
    assert w.slope() is None  # three points over 1 s
    w.add(T0 + 2.0, 4 * MiB)
    assert w.slope() == pytest.approx(2 * MiB)


def test_growth_keeps_one_point_per_spacing() -> None:
    w = GrowthWindow(spacing=1.0)
    for t, mib in [(0.0, 100), (0.5, 900), (1.0, 100), (2.0, 100), (3.0, 100)]:
        w.add(T0 + t, mib * MiB)
    assert w.slope() == pytest.approx(0.0)  # the spike 0.5 s after a point was not kept


def test_growth_forgets_points_older_than_its_window() -> None:
    w = GrowthWindow(seconds=10, spacing=1.0)
    for t in range(100):
        w.add(T0 + t, (100 + 10 * t) * MiB)  # a steep climb...
    for t in range(100, 120):
        w.add(T0 + t, 1090 * MiB)  # ...then flat for longer than the window
    assert w.slope() == pytest.approx(0.0, abs=1.0)


# ---------------------------------------------------------------------- frame dispatch

def info(pid: int, rss: int = 100 * MiB, peak: int = 200 * MiB) -> ProcessInfo:
    return ProcessInfo(pid=pid, start_time=T0 + pid, name="python3", cmdline=["python3"], label=None, uid=1000,
                       alive=True, attached_at=T0, exited_at=None, rss_bytes=rss, rss_peak_bytes=peak,
                       anon_bytes=rss, swap_bytes=0)


def key(pid: int) -> tuple[int, float]:
    return (pid, T0 + pid)


def alert(id: int, state: str, kind: str = AlertKind.LEAK) -> Alert:
    return Alert(id, kind, state, Severity.WARNING, "pid:1", 1.0, 0.5, "grows", T0, [])


@pytest.fixture
def app() -> MemtopApp:
    """An app that is never run: frames go to :meth:`MemtopApp.apply_frame` directly."""
    app = MemtopApp("/nonexistent.sock", connect=False)
    assert app.apply_frame(ListOk(1, [info(1), info(2)]))
    return app


def rows(app: MemtopApp) -> dict[int, ProcRow]:
    return {r.pid: r for r in app.model.snapshot().rows}


def test_list_replaces_the_processes(app: MemtopApp) -> None:
    assert set(rows(app)) == {1, 2}
    assert app.apply_frame(ListOk(2, [info(2), info(3)]))
    assert set(rows(app)) == {2, 3}


def test_sample_updates_memory(app: MemtopApp) -> None:
    fields = list(SAMPLE_FIELDS)
    assert fields[:4] == ["pid", "start_time", "alive", "rss_bytes"]
    assert app.apply_frame(Sample(7, T0 + 5, 0.5, fields, [[1, T0 + 1, True, 150 * MiB, 300 * MiB, MiB, 0]]))
    snap = app.model.snapshot()
    assert (snap.seq, snap.time) == (7, T0 + 5)
    assert (rows(app)[1].rss, rows(app)[1].peak, rows(app)[2].rss) == (150 * MiB, 300 * MiB, 100 * MiB)


def test_sample_flag_sets_peak_exact_without_a_new_list(app: MemtopApp) -> None:
    """A v1.5 row's rss_peak_exact (reset-peaks, an exit record) reaches PEAK's "~" at once;
    an older agent's row (no such column) leaves the list's flag alone."""
    def sample(seq: int, exact: bool) -> Sample:
        return Sample(seq, T0 + seq, 0.5, list(SAMPLE_COLUMNS),
                      [[1, T0 + 1, True, 150 * MiB, 150 * MiB, MiB, 0, None, None, exact, None]])

    assert rows(app)[1].peak_exact
    assert app.apply_frame(sample(7, False))
    assert not rows(app)[1].peak_exact and rows(app)[2].peak_exact
    old = Sample(8, T0 + 8, 0.5, list(SAMPLE_FIELDS), [[1, T0 + 1, True, 160 * MiB, 160 * MiB, MiB, 0]])
    assert app.apply_frame(old)
    assert not rows(app)[1].peak_exact and rows(app)[1].peak == 160 * MiB
    assert app.apply_frame(sample(9, True))
    assert rows(app)[1].peak_exact


def test_history_fills_the_chart(app: MemtopApp) -> None:
    assert app.model.history(key(1)) == []
    assert app.apply_frame(HistoryOk(2, 1.0, [Series(1, T0 + 1, T0 + 10, [MiB, 2 * MiB, 3 * MiB])]))
    assert [v for _, v in app.model.history(key(1))] == [MiB, 2 * MiB, 3 * MiB]


def test_status_sets_host_memory_and_alerts(app: MemtopApp) -> None:
    status = DaemonStatus("memagent", 1, 0, T0, 0.25, "/s", 2, 2, 1, TickStats(1, 0.25, 0.0, 0, 0.0),
                          HostMemory(16 * 1024 * MiB, 4 * 1024 * MiB, 0, 0),
                          alerts_active=[alert(5, AlertState.FIRING)])
    assert app.apply_frame(StatusOk(3, status))
    snap = app.model.snapshot()
    assert snap.host is not None and snap.host.used == 12 * 1024 * MiB
    assert snap.interval == 0.25 and [a.id for a in snap.alerts] == [5]


def test_attached_exited_and_detached(app: MemtopApp) -> None:
    assert app.apply_frame(Attached(info(3)))
    assert set(rows(app)) == {1, 2, 3}
    assert app.apply_frame(Exited(1, T0 + 1, T0 + 9, 500 * MiB))
    assert not rows(app)[1].alive and rows(app)[1].peak == 500 * MiB
    assert app.apply_frame(Detached(2, T0 + 2))
    assert set(rows(app)) == {1, 3}


def test_a_container_named_later_reaches_its_row(app: MemtopApp) -> None:
    """The daemon announces a process again once its container's name is read (v1.7)."""
    cid = "3f1c5e2a9b7d4c6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6"
    boxed = replace(info(1), cgroup=f"/system.slice/docker-{cid}.scope", unit=f"docker-{cid}.scope",
                    container=Container("docker", cid, None))
    assert app.apply_frame(Attached(boxed))
    assert (rows(app)[1].container, rows(app)[1].unit) == ("3f1c5e2a9b7d", f"docker-{cid}.scope")
    assert app.apply_frame(Attached(replace(boxed, container=Container("docker", cid, "llm-server"))))
    assert rows(app)[1].container == "llm-server" and rows(app)[2].container is None


def test_a_keyframes_cut_command_line_keeps_the_whole_one(app: MemtopApp) -> None:
    """Replaying: the next segment's keyframe lists an exited process with its command line
    cut (the recorder's rule); the row keeps the whole one it had; another program's
    command line (an exec) does replace it."""
    whole = ["python3", "serve.py", "--model", "m" * 300]
    assert app.apply_frame(Attached(replace(info(3), cmdline=whole)))
    assert app.apply_frame(Attached(replace(info(3), cmdline=cut_cmdline(whole, 256, 64), alive=False)))
    assert rows(app)[3].cmdline == tuple(whole) and not rows(app)[3].alive
    assert app.apply_frame(Attached(replace(info(3), cmdline=["sleep", "9"])))
    assert rows(app)[3].cmdline == ("sleep", "9")


def test_dropped_is_counted(app: MemtopApp) -> None:
    assert app.apply_frame(Dropped(4))
    assert app.model.snapshot().dropped == 4


def test_stack_reply_and_stack_state(app: MemtopApp) -> None:
    assert app.apply_frame(StackStateChanged(1, T0 + 1, StackState.PENDING, None))
    assert rows(app)[1].stack_state == StackState.PENDING
    reply = StackOk(9, 1, T0 + 1, StackState.NOT_PYTHON, "not a Python process", None, None, [], [])
    assert app.apply_frame(reply)
    assert app.model.stack_for(key(1)) == reply and app.model.stack_for(key(2)) is None
    assert rows(app)[1].stack_state == StackState.NOT_PYTHON


def test_alerts_fire_then_end_in_the_recent_list(app: MemtopApp) -> None:
    assert app.apply_frame(AlertRaised(alert(7, AlertState.FIRING)))
    assert list(app.model.alerts) == [7]
    assert app.apply_frame(AlertRaised(alert(7, AlertState.RESOLVED)))
    assert app.model.alerts == {} and [a.id for a in app.model.recent_alerts] == [7]
    # An OOM kill is an event: straight to the recent ones, though "firing".
    assert app.apply_frame(AlertRaised(alert(8, AlertState.FIRING, AlertKind.OOM_KILL)))
    assert app.model.alerts == {} and [a.id for a in app.model.recent_alerts] == [8, 7]


def test_request_replies_update_the_processes(app: MemtopApp) -> None:
    failed = [Failure(99, "no_such_process", "no process 99")]
    assert app.apply_frame(AttachOk(4, [info(3)], failed))
    assert set(rows(app)) == {1, 2, 3}
    assert app.apply_frame(ResetPeaksOk(5, [info(1, peak=101 * MiB)], []))
    assert rows(app)[1].peak == 101 * MiB
    assert app.apply_frame(DetachOk(6, [ProcessRef(2, T0 + 2)], failed))
    assert set(rows(app)) == {1, 3}


@pytest.mark.parametrize("frame", [Error(12, "no_such_process", "gone"), Ack(3)])
def test_frames_that_leave_the_model_alone(app: MemtopApp, frame: Frame) -> None:
    before = app.model.snapshot()
    app.apply_frame(frame)
    assert app.model.snapshot() == before


@pytest.mark.parametrize("frame", [Ack(3), Subscribe(4)])
def test_frame_types_memtop_has_no_use_for_are_ignored(app: MemtopApp, frame: Frame) -> None:
    assert not app.apply_frame(frame)
    assert set(rows(app)) == {1, 2}
