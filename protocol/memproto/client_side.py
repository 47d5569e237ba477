"""What every client does the same way, sans I/O: the hello it sends, the check of the
daemon's hello, and decoding what the daemon pushes while ignoring frame types a newer
daemon may add, and the errors a client raises. The blocking CLI client and memtop's asyncio
link both use it.
"""

from __future__ import annotations

from collections.abc import Iterable

from .codec import UnknownFrameType, decode
from .errors import ProtocolError
from .frames import Error, Frame, Hello
from .version import PROTOCOL_MAJOR, PROTOCOL_VERSION


def client_hello(software: str) -> Hello:
    return Hello(list(PROTOCOL_VERSION), "client", software)


def check_server_hello(frame: Frame) -> Hello:
    """The daemon's first frame, if it is a hello of our major version; else ProtocolError.
    (An ``Error`` frame is the caller's to report, before calling this.)"""
    if not isinstance(frame, Hello):
        raise ProtocolError(f"expected hello, got {frame.TYPE}")
    if frame.version[0] != PROTOCOL_MAJOR:
        raise ProtocolError(f"daemon speaks protocol v{frame.version[0]}, this client v{PROTOCOL_MAJOR}")
    return frame


def decode_from_server(payloads: Iterable[bytes]) -> list[Frame]:
    """Decode pushed frames; a type this version does not know is skipped by design."""
    frames = []
    for payload in payloads:
        try:
            frames.append(decode(payload))
        except UnknownFrameType:
            continue
    return frames


# --------------------------------------------------------------------------- errors


class ClientError(Exception):
    """Base of what a client (the CLI's or memtop's) raises about its daemon."""


class DaemonNotRunning(ClientError):
    """Nothing listens on the socket path."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"no memagent daemon at {path} (start one with: memagent daemon)")


class ConnectionLost(ClientError):
    """The daemon closed the connection, or the link is not open."""


class RequestFailed(ClientError):
    """The daemon answered with an error frame (a request's, or a refusal to talk)."""

    def __init__(self, error: Error) -> None:
        self.code = error.code
        super().__init__(error.message)
