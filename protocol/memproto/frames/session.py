"""The frames every connection uses: the base class, ``hello``, ``ack`` and ``error``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import ProtocolError
from ..schema import wire


@dataclass(frozen=True, slots=True)
class Frame:
    """Base of all frames; ``TYPE`` is the wire tag."""

    TYPE: ClassVar[str] = ""

    def validate(self) -> None:
        """Cross-field checks beyond field types; raise :class:`ProtocolError`."""


@wire
@dataclass(frozen=True, slots=True)
class Hello(Frame):
    """First frame in each direction. ``version`` is ``[major, minor]``."""

    TYPE: ClassVar[str] = "hello"
    version: list[int]
    role: str
    software: str
    #: Server only: the sample interval in seconds.
    interval: float | None = None
    #: Server only: the daemon's PID.
    pid: int | None = None

    def validate(self) -> None:
        if len(self.version) != 2:
            raise ProtocolError("expected [major, minor]", frame=self.TYPE, field="version")
        if self.role not in ("client", "server"):
            raise ProtocolError("expected 'client' or 'server'", frame=self.TYPE, field="role")


@wire
@dataclass(frozen=True, slots=True)
class Ack(Frame):
    """Reply to requests that return nothing but success (subscribe, unsubscribe)."""

    TYPE: ClassVar[str] = "ack"
    id: int


@wire
@dataclass(frozen=True, slots=True)
class Error(Frame):
    """A request failed as a whole (``id`` is the request's), or a frame could not be tied
    to a request (``id`` nil). After codes ``protocol``, ``too_large`` (from the client),
    ``version`` and ``busy`` the server closes the connection."""

    TYPE: ClassVar[str] = "error"
    id: int | None
    code: str
    message: str
