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
    def __init__(self, reason: str, retry_in: float) -> None:
        super().__init__()
        self.reason = reason
        self.retry_in = retry_in


class FrameArrived(Message):
    def __init__(self, frame: Frame) -> None:
        super().__init__()
        self.frame = frame
