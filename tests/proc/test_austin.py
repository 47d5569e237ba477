"""Austin's samples (memagent.proc.austin): the parser on fixture files of its real output
and on malformed lines, and a real Austin run against real targets."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from memagent.proc.austin import RoundParser, SampleRound, find_austin, parse_frames, parse_line, sample

FIXTURES = Path(__file__).parent.parent / "fixtures" / "austin"
MiB = 1024 * 1024


def rounds_of(name: str) -> tuple[list[SampleRound], RoundParser]:
    parser = RoundParser()
    rounds: list[SampleRound] = []
    for line in (FIXTURES / name).read_text().splitlines():
        rounds += parser.feed(line)
    rounds += parser.flush()
    return rounds, parser


def test_a_real_capture_parses_into_rounds_of_every_thread() -> None:
    rounds, parser = rounds_of("spinner_grow.txt")
    assert parser.start_rss == 24_731_184
    assert len(rounds) == 18
    assert all({t.tid for t in r.threads} <= {2855, 2897} for r in rounds)
    assert sum(r.rss_change for r in rounds) == 31_449_088  # every line's change, none lost
    grew = [r for r in rounds if r.rss_change > 0]
    main = next(t for t in grew[0].threads if t.tid == 2855)
    assert main.active and main.frames()[0].name == "grow" and main.frames()[-1].name == "<module>"
    spinner = next(t for t in rounds[0].threads if t.tid == 2897)
    assert spinner.active and spinner.frames()[0].name == "spin"
    idle = next(t for t in rounds[0].threads if t.tid == 2855)
    assert not idle.active
    assert rounds[-1].elapsed == pytest.approx(len(rounds) * 0.0101, rel=0.05)  # Austin's clock: ~10 ms a round


def test_malformed_lines_are_skipped_and_lose_nothing_else() -> None:
    rounds, parser = rounds_of("malformed.txt")
    assert parser.start_rss is None  # "# memory: not-a-number"
    threads = [t for r in rounds for t in r.threads]
    # Kept: the two good lines of 77, 78 (its one frame INVALID), the odd path, the frameless 79.
    assert [t.tid for t in threads] == [77, 78, 77, 79, 77]
    assert sum(r.rss_change for r in rounds) == MiB - 8192 + 2 * MiB
    assert threads[1].frames() == []  # Austin could not read it: no frame, not "INVALID (?:0)"
    odd = threads[2].frames()[0]
    assert (odd.filename, odd.name, odd.line) == ("/srv/a:b/odd.py", "f", 7)
    assert threads[3].frames() == []
    assert threads[4].frames()[0].line == 0  # "load:x": no line number


@pytest.mark.parametrize("line", ["", "P", "P1 1,0,0", "P1;T0:x;a:b:1 1,0,0", "P1;T0:1;a:b:1 1,0", "#P1;T0:1 1,0,0",
                                  "P1;T0:1;a:b:1 1,0,1e3", "P1;T0:1;" + "a:b:1;" * 20_000 + " 1,0,0"])
def test_hostile_lines_are_none(line: str) -> None:
    assert parse_line(line) is None


def test_frames_that_are_no_place_in_the_program_are_left_out() -> None:
    """Issue 27: growth sites read ``INVALID (?:None)`` and ``_call_with_frames_removed
    (<frozen importlib._bootstrap>)``. The import is the importing line's; memagent's own
    plugin in the target is its caller's; a frame Austin could not read is none."""
    text = ";".join(["/srv/t/test_x.py:<module>:1", "/site/memagent/gate/pytest_plugin.py:pytest_runtest_call:88",
                     "/srv/t/test_x.py:test_big:9", "<frozen importlib._bootstrap>:_find_and_load:1176",
                     "<frozen importlib._bootstrap_external>:exec_module:940",
                     "<frozen importlib._bootstrap>:_call_with_frames_removed:241", "/srv/t/heavy.py:<module>:3",
                     ":INVALID:"])
    assert [(f.name, f.line) for f in parse_frames(text)] == [("<module>", 3), ("test_big", 9), ("<module>", 1)]
    assert parse_frames(":INVALID:;<frozen importlib._bootstrap>:_find_and_load:1") == []
    assert parse_frames("/srv/memagent_fork/app.py:run:5")[0].name == "run"  # not ours: kept


def test_frames_are_innermost_first_and_cached() -> None:
    frames = parse_frames("/a.py:<module>:1;/b.py:f:2")
    assert [(f.name, f.filename, f.line) for f in frames] == [("f", "/b.py", 2), ("<module>", "/a.py", 1)]
    assert parse_frames("/a.py:<module>:1;/b.py:f:2") is frames
    assert parse_frames("") == []


AUSTIN = find_austin()
needs_austin = pytest.mark.skipif(AUSTIN is None, reason="austin is not installed (pip install 'austin-dist<4')")
GROWER = """
import sys, time
kept = []
def grow():
    kept.append(bytearray(b"x") * (4 << 20))
print("ready", flush=True)
for _ in range(20):
    grow()
    time.sleep(0.05)
time.sleep(30)
"""


def _start(code: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.e2e
@needs_austin
def test_a_real_burst_sees_the_growth_and_the_growing_function() -> None:
    assert AUSTIN is not None
    proc = _start(GROWER)
    got: list[SampleRound] = []
    starts: list[int | None] = []
    try:
        end = asyncio.run(sample(AUSTIN, proc.pid, 1, 10, lambda r, s: (got.append(r), starts.append(s))))
    finally:
        proc.kill()
        proc.wait()
    assert end.error is None and end.rounds == len(got) > 40
    assert starts[-1] is not None and starts[-1] > 5 * MiB
    assert sum(r.rss_change for r in got) >= 40 * MiB  # ~80 MiB in the second sampled
    in_grow = [t for r in got for t in r.threads if t.active and t.frames() and t.frames()[0].name == "grow"]
    assert in_grow, "no sample inside grow() in a second of 20 steps"


@pytest.mark.e2e
@needs_austin
def test_a_process_that_is_not_python_ends_the_burst_with_a_reason() -> None:
    assert AUSTIN is not None
    proc = subprocess.Popen(["sleep", "30"])
    try:
        end = asyncio.run(sample(AUSTIN, proc.pid, 1, 10, lambda r, s: None))
    finally:
        proc.kill()
        proc.wait()
    assert end.rounds == 0 and end.not_python and end.error


@pytest.mark.e2e
@needs_austin
def test_a_missing_program_is_a_one_line_error() -> None:
    end = asyncio.run(sample("/nonexistent/austin", os.getpid(), 1, 10, lambda r, s: None))
    assert end.rounds == 0 and end.error is not None
    assert "/nonexistent/austin" in end.error and "\n" not in end.error


@pytest.mark.e2e
@needs_austin
def test_cancelling_a_burst_kills_austin() -> None:
    assert AUSTIN is not None
    proc = _start(GROWER)

    async def go() -> None:
        first = asyncio.Event()
        task = asyncio.ensure_future(sample(AUSTIN, proc.pid, 30, 10, lambda r, s: first.set()))
        await asyncio.wait_for(first.wait(), 10)
        assert _austins_on(proc.pid)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(go())
        assert not _austins_on(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def _austins_on(pid: int) -> list[psutil.Process]:
    me = psutil.Process()
    return [p for p in me.children(recursive=True) if str(pid) in p.cmdline() and "austin" in " ".join(p.cmdline())]


def test_py_spys_frames_are_the_programs_too() -> None:
    """The same rule for py-spy's dumps: the import machinery folded into the importing line."""
    import json

    from memagent.proc.pyspy import parse_dump

    raw = [{"thread_id": 1, "os_thread_id": 11, "thread_name": "MainThread", "active": True, "owns_gil": True,
            "frames": [{"name": "_call_with_frames_removed", "filename": "<frozen importlib._bootstrap>", "line": 241},
                       {"name": "<module>", "filename": "/srv/t/heavy.py", "line": 3}]}]
    dump = parse_dump(json.dumps(raw).encode(), 1.0, "peak", MiB, None)
    assert [(f.name, f.line) for f in dump.threads[0].frames] == [("<module>", 3)]
