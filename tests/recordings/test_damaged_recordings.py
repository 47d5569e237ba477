"""Damaged recordings (docs/security.md, "Damaged recordings"): a directory holding damaged
segments and paths named ``*.mrec`` that are no files reads the rest in every command, one
line per damaged file; a damaged file named alone is one line and exit 1; nothing hangs;
and every reader of a randomly damaged segment gives data or a named error, never another
exception. The segments are the real writer's (:mod:`damaged_recordings`), damaged after."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import as_user
from damaged_recordings import GOOD_PID, damaged_directory, mutations, segment

from memagent.errors import RecordingUnavailable
from memagent.recordings import RECORDING
from memagent.recordings.analysis import report_json
from memagent.recordings.history import Result, csv_rows, of_timeline, text_lines
from memagent.recordings.plot_data import plot_data, title
from memagent.recordings.plot_html import render
from memagent.recordings.report_text import text_lines as report_lines
from memagent.recordings.source import read_timeline
from memproto.recording import RecordingError, SegmentReader
from memtop.replay_data import ReplayEngine, Span, check_recording

MEMAGENT = str(Path(sys.executable).parent / "memagent")
MEMTOP = str(Path(sys.executable).parent / "memtop")
#: Samples of the directory's readable parts: segments 1 and 3 whole (30 each), segment 2
#: up to its corrupt batch (10), segment 4 less the sample whose time is infinite (29).
SAMPLES = 30 + 10 + 30 + 29
#: Lines of the readable segments' damage: segment 2's batch, segment 4's values.
INNER_DAMAGE = {"seg-0002.mrec": "damaged batch", "seg-0004.mrec": "cannot be"}


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A command, its stdin closed; a hang fails the test at ``timeout``."""
    return subprocess.run(list(args), capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout)


def damage_lines(stderr: str, prog: str, folder: Path, bad: dict[str, str]) -> None:
    """One line per damaged file on stderr, naming it and why; nothing else."""
    lines = stderr.splitlines()
    expected = {**bad, **INNER_DAMAGE}
    assert len(lines) == len(expected), lines
    for name, says in expected.items():
        mine = [line for line in lines if line.startswith(f"{prog}: {folder / name}: ")]
        assert len(mine) == 1 and says in mine[0], (name, lines)
    assert "Traceback" not in stderr


@pytest.fixture
def folder(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    return tmp_path / "record", damaged_directory(tmp_path / "record")


@pytest.mark.e2e
def test_report_reads_the_good_segments_and_says_each_damaged_one(folder: tuple[Path, dict[str, str]]) -> None:
    path, bad = folder
    r = run(MEMAGENT, "report", str(path))
    assert r.returncode == 0, r.stderr
    assert "4 segments, " in r.stdout.splitlines()[0] and f", {SAMPLES} samples)" in r.stdout.splitlines()[0]
    damage_lines(r.stderr, "memagent report", path, bad)
    r = run(MEMAGENT, "report", "--json", str(path))
    report = json.loads(r.stdout)
    assert r.returncode == 0 and len(report["damage"]) == len(bad) + len(INNER_DAMAGE)
    assert [p["pid"] for p in report["processes"]][:1] == [GOOD_PID]


@pytest.mark.e2e
def test_history_reads_the_good_segments_and_says_each_damaged_one(folder: tuple[Path, dict[str, str]]) -> None:
    path, bad = folder
    r = run(MEMAGENT, "history", "--from", "recording", "--file", str(path), "--since", "@0", "--csv")
    assert r.returncode == 0, r.stderr
    rows = [line.split(",") for line in r.stdout.splitlines()[1:]]
    assert len([row for row in rows if row[1] == str(GOOD_PID)]) == SAMPLES - 1  # tick 12 of segment 4: NaN
    damage_lines(r.stderr, "memagent history", path, bad)


@pytest.mark.e2e
@pytest.mark.parametrize("suffix", [".html", ".svg"])
def test_plot_draws_the_good_segments_and_says_each_damaged_one(folder: tuple[Path, dict[str, str]],
                                                                 tmp_path: Path, suffix: str) -> None:
    if suffix == ".svg":
        pytest.importorskip("matplotlib")
    path, bad = folder
    out = tmp_path / f"plot{suffix}"
    r = run(MEMAGENT, "plot", str(path), "-o", str(out), timeout=120)
    assert r.returncode == 0, r.stderr
    drawn = out.read_text()
    assert drawn and "NaN" not in drawn and "Infinity" not in drawn
    damage_lines(r.stderr, "memagent plot", path, bad)


def test_memtop_replays_the_good_segments(folder: tuple[Path, dict[str, str]]) -> None:
    path, bad = folder
    assert check_recording(str(path)) is None
    engine = ReplayEngine(Span.open(str(path)))
    engine.index.run()
    assert engine.index.samples == SAMPLES and len(engine.index.damage) == len(bad) + len(INNER_DAMAGE)
    engine.seek(engine.last)
    assert engine.at_end and engine.model.snapshot().rows


@pytest.mark.parametrize("name", ["seg-0005.mrec", "seg-0006.mrec", "seg-0007.mrec", "seg-0008.mrec",
                                  "seg-0010.mrec"])  # seg-0009.mrec, a directory, is read as one
@pytest.mark.e2e
def test_a_damaged_file_named_alone_is_one_line_and_exit_1(folder: tuple[Path, dict[str, str]], name: str) -> None:
    path, bad = folder
    target = str(path / name)
    for args in (["report", target], ["history", "--from", "recording", "--file", target, "--since", "@0"],
                 ["plot", target, "-o", str(path.parent / "x.html")]):
        r = run(MEMAGENT, *args)
        assert r.returncode == 1 and r.stdout == "", (args, r)
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and target in lines[0] and bad[name] in lines[0], (args, lines)
    r = run(MEMTOP, "--replay", target)
    assert r.returncode == 2 and r.stderr.splitlines() == [f"memtop: {target}: {_why(r.stderr, target)}"]


def _why(stderr: str, target: str) -> str:
    return stderr.strip().split(f"{target}: ", 1)[1]


@pytest.mark.e2e
def test_a_directory_of_damaged_segments_only_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a.mrec").write_bytes(b"")
    os.mkfifo(tmp_path / "b.mrec")
    r = run(MEMAGENT, "report", str(tmp_path))
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines()[-1] == f"memagent report: {tmp_path}: none of its 2 segments can be read"
    assert len(r.stderr.splitlines()) == 3


def test_a_second_users_planted_files_do_not_hang_roots_report(test_user: pwd.struct_passwd,
                                                              shared_dir: str) -> None:
    """The user makes a directory of their own holding one good segment, a FIFO named
    ``*.mrec``, a link to a FIFO and a link to a device; root reads it: the good segment,
    one line for each of the others, no hang (a FIFO opened for reading blocks until a
    writer comes) and no traceback."""
    good = segment(1)
    own = Path(shared_dir) / "mine"
    own.mkdir()
    os.chown(own, test_user.pw_uid, test_user.pw_gid)  # theirs: they may put anything in it

    def plant() -> list[str]:
        (own / "0001.mrec").write_bytes(good)
        os.mkfifo(own / "0002.mrec")
        os.mkfifo(own / ".hidden")
        os.symlink(".hidden", own / "0003.mrec")
        os.symlink("/dev/zero", own / "0004.mrec")
        return sorted(os.listdir(own))

    assert as_user(test_user, plant) == [".hidden", "0001.mrec", "0002.mrec", "0003.mrec", "0004.mrec"]
    r = run(MEMAGENT, "report", str(own), timeout=30)
    assert r.returncode == 0, r.stderr
    assert ", 30 samples)" in r.stdout.splitlines()[0]
    lines = r.stderr.splitlines()
    assert [line.split(": ")[1].rsplit("/", 1)[1] for line in lines] == ["0002.mrec", "0003.mrec", "0004.mrec"]
    assert "a FIFO" in lines[0] and "a FIFO" in lines[1] and "a device" in lines[2]


def every_reader(path: str) -> None:
    """What ``report``, ``history``, ``plot`` (its HTML) and ``memtop --replay`` do with a
    recording, in process; a named error (a recording that cannot be read) is an answer."""
    try:
        tl = read_timeline([path], None, None)
    except RecordingUnavailable:
        pass
    else:
        report_lines(report_json(tl, [path], 10))
        found, where = of_timeline(tl, path)
        result = Result(found, RECORDING, where)
        text_lines(result)
        list(csv_rows(result))
        data = plot_data(tl)
        if data is not None:
            render(data, title(data))
    check_recording(path)
    try:
        engine = ReplayEngine(Span.open(path))
    except RecordingError:
        return
    engine.index.run()
    engine.seek(engine.last)
    engine.model.snapshot()


def test_every_reader_of_a_randomly_damaged_segment_answers_or_names_the_error(tmp_path: Path) -> None:
    """400 damaged copies of a segment (bytes flipped, cut or put in; a NaN, an infinity, an
    impossible time or count, a wrong type put into a frame): no reader raises anything but
    a named error, and a segment reader's frames never hold a value that cannot be."""
    path = tmp_path / "fuzzed.mrec"
    for i, data in enumerate(mutations(400, seed=25)):
        path.write_bytes(data)
        try:
            every_reader(str(path))
        except Exception as exc:  # noqa: BLE001 - the failure names the mutation
            pytest.fail(f"mutation {i}: {type(exc).__name__}: {exc}")
        try:
            with path.open("rb") as f:
                list(SegmentReader(f, path.name))
        except RecordingError:
            pass
