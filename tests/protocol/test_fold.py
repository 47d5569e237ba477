"""The one fold of frames into per-(PID, start time) figures (:mod:`memproto.fold`): the
peaks a sample stream shows when they go up and down, a reused PID, an exit, and a frame
type the fold has no use for."""

from __future__ import annotations

from dataclasses import replace

from memproto.fold import Fold
from memproto.frames import Attached, Detached, Dropped, Exited, Sample
from memproto.records import SAMPLE_COLUMNS, ProcessInfo
from memproto.text import CUT, cut_cmdline, fuller_cmdline

MiB = 1024 * 1024
T0 = 1_764_511_200.0

Row = tuple[int, float, bool, int, int, int | None, bool | None]


def sample(t: float, rows: list[Row]) -> Sample:
    """A tick in the agent's columns: (pid, start, alive, RSS, RSS peak, VRAM peak, exact) per row."""
    return Sample(1, t, 1.0, list(SAMPLE_COLUMNS),
                  [[pid, start, alive, rss, peak, rss, 0, vram, vram, exact, None]
                   for pid, start, alive, rss, peak, vram, exact in rows])


def info(pid: int, start: float, name: str, label: str | None = None) -> ProcessInfo:
    return ProcessInfo(pid, start, name, [name, "train.py"], label, 1000, True, start, None,
                       MiB, 9 * MiB, MiB, 0)


def test_peaks_keep_the_highest_and_when_it_was_first_seen() -> None:
    fold = Fold()
    assert fold.apply(Attached(info(10, T0, "python3", "train")))
    fold.apply(sample(T0 + 1, [(10, T0, True, 100 * MiB, 100 * MiB, None, True)]))
    fold.apply(sample(T0 + 2, [(10, T0, True, 300 * MiB, 300 * MiB, 2 * MiB, False)]))
    fold.apply(sample(T0 + 3, [(10, T0, True, 200 * MiB, 300 * MiB, 5 * MiB, True)]))
    fold.apply(sample(T0 + 4, [(10, T0, True, 250 * MiB, 250 * MiB, 1 * MiB, True)]))  # a reset: lower
    p = fold.processes[(10, T0)]
    assert (p.name, p.label, p.cmdline) == ("python3", "train", ["python3", "train.py"])
    # the attached frame's 9 MiB peak is not taken: samples say the figures, with a time
    assert (p.rss_peak_bytes, p.rss_peak_time, p.rss_peak_exact) == (300 * MiB, T0 + 2, False)
    assert (p.vram_peak_bytes, p.vram_peak_time) == (5 * MiB, T0 + 3)
    assert (p.rss_bytes, p.vram_bytes) == (250 * MiB, 1 * MiB)
    assert (p.first_seen, p.last_seen, p.alive, p.exited_at) == (T0 + 1, T0 + 4, True, None)


def test_a_reused_pid_is_a_new_process() -> None:
    fold = Fold()
    fold.apply(sample(T0 + 1, [(10, T0, True, 600 * MiB, 600 * MiB, None, True)]))
    fold.apply(Exited(10, T0, T0 + 2, 700 * MiB))
    fold.apply(Attached(info(10, T0 + 5, "worker")))
    fold.apply(sample(T0 + 6, [(10, T0, False, 600 * MiB, 600 * MiB, None, True),
                               (10, T0 + 5, True, 100 * MiB, 100 * MiB, None, True)]))
    old, new = fold.processes[(10, T0)], fold.processes[(10, T0 + 5)]
    assert old.rss_peak_bytes == 700 * MiB and not old.alive
    assert (new.name, new.rss_peak_bytes, new.alive, new.exited_at, new.first_seen) == (
        "worker", 100 * MiB, True, None, T0 + 6)


def test_an_exit_ends_the_process_with_its_peak() -> None:
    fold = Fold()
    fold.apply(sample(T0 + 1, [(10, T0, True, 100 * MiB, 100 * MiB, None, True)]))
    fold.apply(sample(T0 + 2, [(10, T0, False, 100 * MiB, 100 * MiB, None, True)]))
    p = fold.processes[(10, T0)]
    assert p.exited_at == T0 + 2 and not p.alive and not p.exit_seen  # seen gone, no exit record yet
    fold.apply(Exited(10, T0, T0 + 1.5, 400 * MiB))
    assert (p.exited_at, p.exit_peak_bytes, p.rss_peak_bytes, p.rss_peak_time) == (
        T0 + 1.5, 400 * MiB, 400 * MiB, T0 + 1.5)
    assert p.exit_seen
    fold.apply(Exited(11, T0, T0 + 3, 50 * MiB))  # an exit of a process never sampled: known by it
    assert fold.processes[(11, T0)].rss_peak_bytes == 50 * MiB


def test_other_frame_types_change_nothing() -> None:
    fold = Fold()
    fold.apply(sample(T0 + 1, [(10, T0, True, 100 * MiB, 100 * MiB, None, None)]))
    assert fold.processes[(10, T0)].rss_peak_exact  # nil (an older agent): exact
    before = dict(fold.processes)
    assert not fold.apply(Dropped(3))
    assert not fold.apply(Detached(10, T0))
    assert fold.processes == before and fold.get((10, T0)) is before[(10, T0)]


def test_a_keyframes_cut_command_line_does_not_replace_the_whole_one() -> None:
    """The recorder's keyframes carry an exited process's command line cut (each argument
    to 64 characters, 256 in all, ``…`` for the rest): a reader that read its ``attached``
    frame keeps the whole one; a new program's command line does replace it."""
    whole = ["python3", "serve.py", "--model", "m" * 300, *(f"--opt{i}" for i in range(100))]
    cut = cut_cmdline(whole, 256, 64)
    assert cut[3] == "m" * 63 + CUT and cut[-1] == CUT and sum(map(len, cut)) <= 256 + 1
    assert fuller_cmdline(cut, whole) == whole
    assert fuller_cmdline(["sleep", "10"], whole) == ["sleep", "10"]  # it ran another program
    assert fuller_cmdline(cut, []) == cut  # nothing better known
    assert fuller_cmdline(whole, whole) == whole
    f = Fold()
    p = info(7, 50.0, "python3")
    f.apply(Attached(replace(p, cmdline=whole)))
    f.apply(Attached(replace(p, cmdline=cut, alive=False)))  # the next segment's keyframe
    figures = f.get((7, 50.0))
    assert figures is not None and figures.cmdline == whole and not figures.alive
