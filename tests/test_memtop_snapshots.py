"""Snapshot tests of memtop's screens, fed by a fixed frame sequence (no clock, no socket).

Regenerate after an intended change with ``pytest tests/test_memtop_snapshots.py
--snapshot-update`` and look at the SVGs before committing them.
"""

from __future__ import annotations

from typing import Any

from memtop_replay import frames
from textual.pilot import Pilot

from memtop.app import MemtopApp
from memtop.widgets.header import LinkState


def replayed_app() -> MemtopApp:
    return MemtopApp("/run/memagent/memagent.sock", connect=False)


async def replay(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, MemtopApp)
    app.link_state = LinkState(True, "/run/memagent/memagent.sock", False, "")
    for frame in frames():
        app.feed(frame)
    await pilot.pause()


def test_main_screen_80x24(snap_compare: Any) -> None:
    assert snap_compare(replayed_app(), terminal_size=(80, 24), run_before=replay)


def test_main_screen_wide(snap_compare: Any) -> None:
    assert snap_compare(replayed_app(), terminal_size=(140, 40), run_before=replay)


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


def test_disconnected_state(snap_compare: Any) -> None:
    async def down(pilot: Pilot[Any]) -> None:
        await replay(pilot)
        app = pilot.app
        assert isinstance(app, MemtopApp)
        app.link_state = LinkState(False, "/run/memagent/memagent.sock", False,
                                   "the daemon closed the connection; retrying in 2s")
        await pilot.pause()

    assert snap_compare(replayed_app(), terminal_size=(100, 30), run_before=down)
