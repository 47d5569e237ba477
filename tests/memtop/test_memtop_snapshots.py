"""Snapshot tests of memtop's screens, fed by a fixed frame sequence (no clock, no socket).

Regenerate after an intended change with ``pytest tests/memtop/test_memtop_snapshots.py
--snapshot-update`` and look at the SVGs before committing them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from memtop_replay import MiB, frames
from textual.pilot import Pilot

from memproto.frames import Sample
from memtop.app import MemtopApp
from memtop.widgets.detail import RssPanel
from memtop.widgets.header import LinkState, MemHeader
from memtop.widgets.stack import StackPanel, dump_lines
from memtop.widgets.table import ProcessTable


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    """memtop shows local times: pin the zone so the screens are the same everywhere."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


def replayed_app() -> MemtopApp:
    return MemtopApp("/run/memagent/memagent.sock", connect=False)


async def replay(pilot: Pilot[Any], gpus: bool = False) -> None:
    app = pilot.app
    assert isinstance(app, MemtopApp)
    app.link_state = LinkState(True, "/run/memagent/memagent.sock", False, "")
    for frame in frames(gpus):
        app.feed(frame)
    await pilot.pause()


def test_main_screen_80x24(snap_compare: Any) -> None:
    assert snap_compare(replayed_app(), terminal_size=(80, 24), run_before=replay)


def test_main_screen_wide(snap_compare: Any) -> None:
    assert snap_compare(replayed_app(), terminal_size=(140, 40), run_before=replay)


def test_main_screen_with_gpus(snap_compare: Any) -> None:
    """GPU bars in the header, VRAM and peak VRAM columns (hidden on a box without GPUs)."""

    async def with_gpus(pilot: Pilot[Any]) -> None:
        await replay(pilot, gpus=True)

    assert snap_compare(replayed_app(), terminal_size=(120, 34), run_before=with_gpus)


def test_detail_hidden(snap_compare: Any) -> None:
    async def hide_detail(pilot: Pilot[Any]) -> None:
        await replay(pilot)
        await pilot.press("enter")

    assert snap_compare(replayed_app(), terminal_size=(100, 30), run_before=hide_detail)


def test_help_screen(snap_compare: Any) -> None:
    async def help_(pilot: Pilot[Any]) -> None:
        await replay(pilot)
        await pilot.press("question_mark")

    assert snap_compare(replayed_app(), terminal_size=(100, 30), run_before=help_)


def test_alert_log(snap_compare: Any) -> None:
    async def log(pilot: Pilot[Any]) -> None:
        await replay(pilot)
        await pilot.press("l")

    assert snap_compare(replayed_app(), terminal_size=(120, 30), run_before=log)


def test_disconnected_state(snap_compare: Any) -> None:
    async def down(pilot: Pilot[Any]) -> None:
        await replay(pilot)
        app = pilot.app
        assert isinstance(app, MemtopApp)
        app.link_state = LinkState(False, "/run/memagent/memagent.sock", False,
                                   "no memagent daemon at /run/memagent/memagent.sock", attempt=3, lost=True)
        await pilot.pause()

    assert snap_compare(replayed_app(), terminal_size=(100, 30), run_before=down)


async def test_cursor_stays_on_its_process_when_rows_resort() -> None:
    """Detach and reset act on the selected row: a re-sort must never move the selection."""
    app = replayed_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await replay(pilot)
        table = app.query_one(ProcessTable)
        table.cursor = 3
        chosen = table.rows[3].pid
        # A new sample in which the chosen process becomes the biggest: it moves to the top.
        sample = [f for f in frames() if isinstance(f, Sample)][-1]
        assert isinstance(sample, Sample)
        rows = [list(r) for r in sample.rows]
        for r in rows:
            if r[0] == chosen:
                r[3] = r[4] = 8 * 1024 * MiB
        app.feed(Sample(sample.seq + 1, sample.time + 0.5, sample.interval, sample.fields, rows))
        await pilot.pause()
        assert table.rows[0].pid == chosen
        assert table.selected is not None and table.selected.pid == chosen
        assert app.selected_key == table.selected.key


async def test_stack_names_are_shown_verbatim_not_as_markup() -> None:
    """A thread or function name is the target's data: '[bold red]' must appear as typed."""
    app = replayed_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await replay(pilot)
        panel = app.query_one(StackPanel)
        assert panel.reply is not None
        # Render with the thread that has markup-like names attributed.
        dump = panel.reply.latest
        assert dump is not None
        lines = dump_lines(replace(dump, attributed_thread=2), "latest")
        text = "\n".join(line.plain for line in lines)
        assert "[bold red]loader[/] <b>" in text and "[link=x]fetch[/link]" in text
        assert all(not span.style or "red" not in str(span.style) for line in lines for span in line.spans
                   if "loader" in line.plain[span.start:span.end])


async def test_sort_hotkeys() -> None:
    """M sorts by RSS (biggest first), M again reverses it, N by name, P back to peak."""
    app = replayed_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await replay(pilot)
        table = app.query_one(ProcessTable)
        await pilot.press("M")
        assert (app.sort_column, app.sort_reverse) == ("rss", False)
        alive = [r.rss for r in table.rows if r.alive]
        assert alive == sorted(alive, reverse=True) and table.rows[0].alive
        await pilot.press("M")
        assert (app.sort_column, app.sort_reverse) == ("rss", True)
        await pilot.press("N")
        names = [r.display_name.lower() for r in table.rows]
        assert (app.sort_column, app.sort_reverse) == ("name", False) and names == sorted(names)
        await pilot.press("P")
        assert app.sort_column == "peak" and table.rows[0].display_name == "resnet50-train"


async def test_the_main_screen_follows_the_data_under_a_modal_screen() -> None:
    """The widgets are bound to the app's reactives: frames arriving while the help is
    open land on the main screen's widgets."""
    app = replayed_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await replay(pilot)
        await pilot.press("question_mark")
        assert len(app.screen_stack) == 2
        last = [f for f in frames() if isinstance(f, Sample)][-1]
        assert isinstance(last, Sample)
        ranker = next(list(r) for r in last.rows if r[0] == 4149)
        ranker[3] = ranker[4] = 8 * 1024 * MiB  # now the biggest
        app.feed(Sample(last.seq + 1, last.time + 0.5, last.interval, last.fields, [ranker]))
        await pilot.pause()
        main = app.screen_stack[0]
        assert main.query_one(MemHeader).snapshot.seq == last.seq + 1
        assert main.query_one(RssPanel).now == last.time + 0.5
        assert main.query_one(ProcessTable).rows[0].pid == 4149


async def test_a_long_reason_is_shown_whole_while_disconnected() -> None:
    """The status line cuts the reason at the edge; the notice under it says it whole,
    wrapped (issue 28: a refused connect's group and the command to join it were cut)."""
    from memtop.widgets.header import LinkNotice

    reason = ("cannot connect to /run/memagent/memagent.sock: Permission denied: connecting takes group memagent "
              "(an administrator adds you with: usermod -aG memagent alice; then log in again)")
    app = replayed_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await replay(pilot)
        app.link_state = LinkState(False, "/run/memagent/memagent.sock", False, reason, attempt=2)
        await pilot.pause()
        notice = app.query_one(LinkNotice)
        assert notice.display and reason in str(notice.render())
        assert notice.size.height >= 3  # wrapped: the state, then the reason on two lines at 100 columns
        app.link_state = LinkState(True, "/run/memagent/memagent.sock", False, "")
        await pilot.pause()
        assert not notice.display
