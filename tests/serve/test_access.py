"""Who a client is and what it may see (:mod:`memagent.serve.access`): the admin decision,
and the filtering of watched PIDs, alerts and headroom views for a client that is not one."""

from __future__ import annotations

import dataclasses
import grp
import os
import socket

import pytest
from proctree import FIXTURE, TRAINER, WEIRD, ZOMBIE, GiB, MiB

from memagent.core.registry import Registry
from memagent.errors import ConfigError
from memagent.proc.procfs import ProcFS
from memagent.serve.access import (
    Access,
    AccessPolicy,
    Peer,
    alert_for,
    headroom_for,
    own_pids,
    peer_credentials,
    resolve_group,
)
from memproto.records import Alert, Contributor, Headroom

MINE = Contributor(TRAINER, "bert", 100 * MiB)  # uid 1000's
THEIRS = Contributor(WEIRD, "gpt", 200 * MiB)  # uid 1001's
ADMIN_GID = 24  # in TRAINER's fixture status: "Groups: 4 24 27 1000"
PROCFS = ProcFS(root=str(FIXTURE))  # read only here


def user(uid: int) -> Access:
    return Access(Peer(pid=7001, uid=uid, gid=uid, groups=frozenset()), sees_all=False)


def alert(id: int, pid: int | None, contributors: list[Contributor]) -> Alert:
    return Alert(id=id, kind="headroom" if pid is None else "leak", state="firing", severity="warning",
                 resource="host" if pid is None else f"pid:{pid}", value=1.0, threshold=0.9, message="m",
                 time=1.0, contributors=contributors, pid=pid)


def test_own_pids(registry: Registry) -> None:
    for pid in (TRAINER, WEIRD, ZOMBIE):
        registry.attach(pid)
    zombie = registry.find_alive(ZOMBIE)
    assert zombie is not None
    registry.mark_exited([zombie], now=100.0)
    assert own_pids(user(1000), registry) == {TRAINER, ZOMBIE}  # exited ones too, until detached
    assert own_pids(user(1001), registry) == {WEIRD}
    assert own_pids(user(2000), registry) == set()
    assert own_pids(Access(Peer(1, 0, 0), sees_all=True), registry) is None


def test_alert_for() -> None:
    box_wide = alert(1, None, [THEIRS, MINE])
    about_theirs = alert(2, WEIRD, [THEIRS])
    about_mine = alert(3, TRAINER, [MINE])
    own = {TRAINER}
    assert alert_for(box_wide, own) == dataclasses.replace(box_wide, contributors=[MINE])
    assert alert_for(about_theirs, own) is None
    assert alert_for(about_mine, own) == about_mine
    assert alert_for(box_wide, set()) == dataclasses.replace(box_wide, contributors=[])
    assert alert_for(about_theirs, None) is about_theirs  # an admin sees it all


def test_headroom_for() -> None:
    view = Headroom("host", "host memory", 1 * GiB, 300 * MiB, 0.29, 32 * GiB, 0, 0, True, [THEIRS, MINE])
    assert headroom_for(view, {TRAINER}) == dataclasses.replace(view, top=[MINE])
    assert headroom_for(view, set()).top == []
    assert headroom_for(view, None) is view


def test_root_sees_everything_and_without_an_admin_group_nobody_else() -> None:
    policy = AccessPolicy(admin_gid=None, procfs=PROCFS)
    assert policy.access(Peer(7001, 0, 0, None)).sees_all
    member = Peer(TRAINER, 1000, 1000, frozenset({ADMIN_GID}))
    assert policy.access(member) == Access(member, sees_all=False)


@pytest.mark.parametrize(("peer", "sees_all"), [
    (Peer(7001, 1000, 1000, frozenset({27, ADMIN_GID})), True),  # SO_PEERGROUPS lists it
    (Peer(7001, 1000, ADMIN_GID, frozenset()), True),  # its primary group
    (Peer(7001, 1000, 1000, frozenset({27})), False),
    (Peer(TRAINER, 1000, 1000, frozenset()), False),  # SO_PEERGROUPS is the truth, not /proc
    (Peer(TRAINER, 1000, 1000, None), True),  # no SO_PEERGROUPS: /proc/4242/status lists it
    (Peer(WEIRD, 1001, 100, None), False),  # /proc/4244/status: no supplementary group
    (Peer(999999, 1000, 1000, None), False),  # the client is gone: its primary group is all we know
    (Peer(999999, 1000, ADMIN_GID, None), True),
], ids=["peergroups", "primary", "other-groups", "peergroups-over-proc", "proc", "proc-no-groups",
        "gone", "gone-primary"])
def test_the_admin_group_sees_everything(peer: Peer, sees_all: bool) -> None:
    access = AccessPolicy(admin_gid=ADMIN_GID, procfs=PROCFS).access(peer)
    assert access == Access(peer, sees_all)
    assert access.may_watch(4321) is sees_all and access.may_watch(peer.uid)  # 4321: a stranger


def test_resolve_group() -> None:
    assert resolve_group(None) is None and resolve_group("") is None
    assert resolve_group("4321") == 4321
    assert resolve_group(grp.getgrgid(0).gr_name) == 0
    with pytest.raises(ConfigError) as err:
        resolve_group("no-such-group-memagent-test", "admin_group")
    assert err.value.key == "admin_group"
    assert err.value.reason == "no such group: 'no-such-group-memagent-test'"


def test_peer_credentials_of_a_real_socket() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        peer = peer_credentials(a)
    assert (peer.pid, peer.uid, peer.gid) == (os.getpid(), os.getuid(), os.getgid())
    assert peer.groups is None or peer.groups == frozenset(os.getgroups())
