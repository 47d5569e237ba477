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
from dataclasses import dataclass, replace

from memproto.client_side import peer_ucred
from memproto.records import Alert, Headroom

from ..core.registry import Registry
from ..errors import ConfigError, MemagentError
from ..proc.procfs import ProcFS

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
    pid, uid, gid = peer_ucred(sock)
    groups: frozenset[int] | None
    try:
        blob = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, _MAX_GROUPS_BYTES)
        groups = frozenset(struct.unpack(f"{len(blob) // 4}I", blob))
    except OSError:
        groups = None
    return Peer(pid, uid, gid, groups)


def resolve_group(name: str | None, key: str = "group") -> int | None:
    """GID of a group name (or a numeric GID); None when unset. ConfigError naming
    ``key`` when there is no such group."""
    if not name:
        return None
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ConfigError(key, f"no such group: {name!r}") from None


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
            groups |= self.procfs.groups(peer.pid)
        except MemagentError:
            pass  # the client already exited: its primary group is all we know
        return groups

    def access(self, peer: Peer) -> Access:
        if peer.uid == 0:
            return Access(peer, True)
        if self.admin_gid is not None and self.admin_gid in self._groups(peer):
            return Access(peer, True)
        return Access(peer, False)


# --------------------------------------------------------------------------- what a client sees


def own_pids(access: Access, registry: Registry) -> set[int] | None:
    """The PIDs of the watched processes this client may see; None: all of them."""
    if access.sees_all:
        return None
    return {w.pid for w in registry.entries.values() if w.uid == access.peer.uid}


def alert_for(alert: Alert, own: set[int] | None) -> Alert | None:
    """What a client (its :func:`own_pids`) may see of an alert: nothing of an alert about
    another user's process; box-wide alerts without others' processes among the
    contributors."""
    if own is None:
        return alert
    if alert.pid is not None and alert.pid not in own:
        return None
    return replace(alert, contributors=[c for c in alert.contributors if c.pid in own])


def headroom_for(view: Headroom, own: set[int] | None) -> Headroom:
    """A headroom view without other users' processes among its contributors (its top,
    now and at the observed maximum); the totals are the box's, seen by all (§2.4)."""
    if own is None:
        return view
    return replace(view, top=[c for c in view.top if c.pid in own], now_top=[c for c in view.now_top if c.pid in own],
                   observed_top=[c for c in view.observed_top if c.pid in own])
