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
#: Linux's SO_PEERGROUPS (4.13+): the peer's supplementary groups as of connect().
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)
_MAX_GROUPS_BYTES = 4 * 4096


@dataclass(frozen=True, slots=True)
class Peer:
    pid: int
    uid: int
    gid: int
    #: Supplementary groups from SO_PEERGROUPS; None where the kernel lacks it.
    groups: frozenset[int] | None = None


def peer_credentials(sock: socket.socket) -> Peer:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    groups: frozenset[int] | None
    try:
        blob = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, _MAX_GROUPS_BYTES)
        groups = frozenset(struct.unpack(f"{len(blob) // 4}I", blob))
    except OSError:
        groups = None
    return Peer(pid, uid, gid, groups)


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
        groups = {peer.gid}
        if peer.groups is not None:
            return groups | peer.groups
        # No SO_PEERGROUPS: read the client's groups from /proc (racy if it already exited).
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
