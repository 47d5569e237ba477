"""Messages the connection worker posts to the app. Nothing else crosses that boundary."""

from __future__ import annotations

from textual.message import Message

from memproto.frames import Frame


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
