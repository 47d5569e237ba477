"""Errors raised while decoding or framing, or reading a recording. All derive from
:class:`ProtocolError`, the wire's root (the agent's is :class:`memagent.errors.MemagentError`,
a client's :class:`memproto.client_side.ClientError`).

A decoding error names the frame type and the field, so a peer sending a bad frame
learns what was wrong instead of the daemon failing with a ``KeyError``.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """A frame that cannot be accepted: malformed, of a wrong shape, or too large."""

    code = "protocol"

    def __init__(self, reason: str, *, frame: str | None = None, field: str | None = None) -> None:
        self.reason = reason
        self.frame = frame
        self.field = field
        where = ".".join(part for part in (frame, field) if part)
        super().__init__(f"{where}: {reason}" if where else reason)


class FrameTooLarge(ProtocolError):
    """A length prefix announced more bytes than the receiver accepts."""

    code = "too_large"

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes")


class IncompatibleVersion(ProtocolError):
    """The peer speaks another major protocol version."""

    code = "version"

    def __init__(self, theirs: int, ours: int) -> None:
        self.theirs = theirs
        self.ours = ours
        super().__init__(f"peer speaks protocol v{theirs}, this side speaks v{ours}")


class RecordingError(ProtocolError):
    """A file that is not a recording this version can read (the message names it).

    A recording is wire frames in a file, read by the wire's code (``memproto.recording``,
    which re-exports it), so its root is the wire's. Where ``ProtocolError`` is caught
    (the daemon's sessions, the CLI's ``main``, memtop's link) no recording is read; the
    readers of recordings catch :class:`RecordingError` by name.
    """


class DamagedSegment(RecordingError):
    """A segment whose start cannot be read: zero bytes, a cut or damaged magic or header
    (a segment renamed into place but never written to the disk, after a power loss).
    In a directory the readers skip it with this one line and read the others."""

    code = "damaged_segment"


class NotARegularFile(RecordingError):
    """A path named like a segment that is not a regular file (a FIFO, a device, a
    directory, a link to one): never opened for reading, so that it cannot hang a reader."""

    code = "not_regular_file"
