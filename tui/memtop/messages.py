"""Messages the connection worker (or, in a replay, the replay worker) posts to the app.
Nothing else crosses that boundary."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.message import Message
from textual.notifications import SeverityLevel

from memproto.frames import Frame

if TYPE_CHECKING:
    from .model import FleetModel, Snapshot
    from .replay_types import ReplayState


class LinkUp(Message):
    def __init__(self, path: str, embedded: bool) -> None:
        super().__init__()
        self.path = path
        self.embedded = embedded


class LinkDown(Message):
    """The link is down: ``reason``; try number ``attempt`` failed (0: the link just
    dropped) and the next comes in ``retry_in`` s; ``lost``: a link was up before."""

    def __init__(self, reason: str, retry_in: float, attempt: int = 0, lost: bool = False) -> None:
        super().__init__()
        self.reason = reason
        self.retry_in = retry_in
        self.attempt = attempt
        self.lost = lost


class FrameArrived(Message):
    def __init__(self, frame: Frame) -> None:
        super().__init__()
        self.frame = frame


class ReplayMoved(Message):
    """The replay worker (``memtop --replay``) moved: show ``state``, with ``model`` the
    model of that moment (a new one after a seek back; None: none, the recording did not
    read) and ``snapshot`` taken of it (None: no frame came, only the clock moved)."""

    def __init__(self, state: ReplayState, model: FleetModel | None, snapshot: Snapshot | None) -> None:
        super().__init__()
        self.state = state
        self.model = model
        self.snapshot = snapshot


class ReplayNote(Message):
    """One line for the user about the recording (damage skipped, a gap crossed)."""

    def __init__(self, text: str, severity: SeverityLevel = "information") -> None:
        super().__init__()
        self.text = text
        self.severity = severity
