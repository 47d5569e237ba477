"""Protocol version. A client and a server talk when their major versions match.

The minor version grows when fields or frame types are added; an older peer ignores
what it does not know, so minor differences never break a connection.
"""

from __future__ import annotations

PROTOCOL_MAJOR = 1
PROTOCOL_MINOR = 11
PROTOCOL_VERSION: tuple[int, int] = (PROTOCOL_MAJOR, PROTOCOL_MINOR)


def compatible(major: int) -> bool:
    """True when a peer speaking ``major`` can talk to us."""
    return major == PROTOCOL_MAJOR
