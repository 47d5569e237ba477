"""memtop's one frame→model table (:data:`memtop.model.FRAME_HANDLERS`, through
:meth:`FleetModel.apply`): the live app and the replay hand every frame to it, so a frame
type added to it (``docs/architecture.md``, "Request or event frame") is seen by both,
and one the live app uses cannot be missed by replay."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memproto.frames import EVENTS, REPLIES, Error, Frame
from memproto.recording import RECORDING_TYPES
from memtop.app import MemtopApp
from memtop.model import FRAME_HANDLERS, FleetModel
from memtop.replay_data import Playhead

#: Every frame type memtop can be given: the wire's events and replies, a recording's own.
ALL_TYPES: tuple[type[Frame], ...] = (*EVENTS, *REPLIES, *RECORDING_TYPES.values())
#: The replies the live app uses (it sends the matching requests); Ack and Error change no model.
USED_REPLIES = tuple(t for t in REPLIES if t.__name__ not in ("Ack", "Error"))


def bare(kind: type[Frame]) -> Frame:
    """An instance of ``kind`` with no fields set: the spy below never reads them."""
    return object.__new__(kind)


@pytest.fixture
def applied(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[type[Frame]]]:
    """The frame types that reached :meth:`FleetModel.apply` (which then does nothing)."""
    seen: list[type[Frame]] = []

    def spy(self: FleetModel, frame: Frame) -> bool:
        seen.append(type(frame))
        return type(frame) in FRAME_HANDLERS

    monkeypatch.setattr(FleetModel, "apply", spy)
    yield seen


def test_every_event_and_used_reply_has_an_entry() -> None:
    missing = [t.__name__ for t in (*EVENTS, *USED_REPLIES, *RECORDING_TYPES.values()) if t not in FRAME_HANDLERS]
    assert missing == []


def test_the_apps_own_handlers_only_add_to_the_models() -> None:
    """What the app does beyond the model is for replies the model handles too (or Error):
    none is a model change that replay would not make."""
    app = MemtopApp("/nonexistent.sock", connect=False)
    extra = {t for t in app._handlers if t is not Error}
    assert extra <= set(FRAME_HANDLERS)


def test_live_and_replay_hand_every_frame_to_the_same_model_apply(applied: list[type[Frame]]) -> None:
    app = MemtopApp("/nonexistent.sock", connect=False)
    app._handlers = {}  # the app's extras (a failure said) read fields; only the model path is asked here
    live = {t for t in ALL_TYPES if app.apply_frame(bare(t))}
    assert applied == list(ALL_TYPES)

    applied.clear()
    frames = [bare(t) for t in ALL_TYPES]
    head = Playhead(FleetModel(), iter([(float(i), f) for i, f in enumerate(frames)]))  # what every replay moves
    head.advance(float(len(frames)))
    assert applied == list(ALL_TYPES)
    assert live == {t for t in ALL_TYPES if t in FRAME_HANDLERS}
    assert live >= set(EVENTS)
