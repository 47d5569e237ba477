"""Who is on the other end of the socket, and what they may see.

The kernel tells us the peer's credentials at ``connect()`` time (``SO_PEERCRED``); they
cannot be forged by the client. Root, and members of the configured admin group, see and
change every watched process; anyone else only processes whose real UID is their own.
Who may connect at all is decided by the socket file's mode (0660) and group.
"""

from __future__ import annotations

import grp
import socket
import struct
from dataclasses import dataclass

from .procfs import ProcFS, parse_status_groups

_UCRED = struct.Struct("3i")


@dataclass(frozen=True, slots=True)
class Peer:
    pid: int
    uid: int
    gid: int


def peer_credentials(sock: socket.socket) -> Peer:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return Peer(pid, uid, gid)


def resolve_group(name: str | None) -> int | None:
    """GID of a group name (or a numeric GID); None when unset. Raises KeyError if unknown."""
    if not name:
        return None
    if name.isdigit():
        return int(name)
    return grp.getgrnam(name).gr_gid


@dataclass(frozen=True, slots=True)
class Access:
    """What one connected client may do, decided once at connect time."""

    peer: Peer
    sees_all: bool

    def may_watch(self, uid: int) -> bool:
        return self.sees_all or uid == self.peer.uid


class AccessPolicy:
    def __init__(self, admin_gid: int | None = None, procfs: ProcFS | None = None) -> None:
        self.admin_gid = admin_gid
        self.procfs = procfs or ProcFS()

    def _groups(self, peer: Peer) -> set[int]:
        # SO_PEERCRED gives the primary GID only; supplementary groups are in /proc.
        groups = {peer.gid}
        try:
            groups |= parse_status_groups(self.procfs.read(peer.pid, "status"))
        except (OSError, ValueError):
            pass  # the client already exited: its primary group is all we know
        return groups

    def access(self, peer: Peer) -> Access:
        if peer.uid == 0:
            return Access(peer, True)
        if self.admin_gid is not None and self.admin_gid in self._groups(peer):
            return Access(peer, True)
        return Access(peer, False)
