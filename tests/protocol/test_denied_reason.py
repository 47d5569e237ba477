"""memproto.client_side.denied_reason: a refused connect names the group that may
connect and what to do (issue 28), from the socket's group, else its directory's."""

from __future__ import annotations

import grp
import os
from collections.abc import Callable

import pytest

from memproto.client_side import denied_reason

DENIED = "Permission denied"


def _stat_of(gids: dict[str, int]) -> Callable[[str], os.stat_result]:
    def stat(path: str) -> os.stat_result:
        if path not in gids:
            raise PermissionError(13, DENIED)
        return os.stat_result((0o140660, 0, 0, 1, 0, gids[path], 0, 0, 0, 0))

    return stat


def _a_group_with_members() -> grp.struct_group:
    for g in grp.getgrall():
        if g.gr_gid and g.gr_mem:
            return g
    pytest.skip("no group with members on this box")


def test_outside_the_group_the_line_says_how_to_be_added() -> None:
    g = grp.getgrall()[-1] if grp.getgrall()[-1].gr_gid else pytest.skip("no group but root")
    path = "/run/memagent/memagent.sock"
    line = denied_reason(path, DENIED, stat=_stat_of({path: g.gr_gid}), groups=lambda: [], user="alice-not-a-member")
    assert line == (f"{DENIED}: connecting takes group {g.gr_name} (an administrator adds you with: "
                    f"usermod -aG {g.gr_name} alice-not-a-member; then log in again)")


def test_a_member_whose_session_predates_it_is_told_to_log_in_again() -> None:
    g = _a_group_with_members()
    line = denied_reason("/s/memagent.sock", DENIED, stat=_stat_of({"/s/memagent.sock": g.gr_gid}),
                         groups=lambda: [], user=g.gr_mem[0])
    assert f"which you were added to after this session began (log in again, or: newgrp {g.gr_name})" in line


def test_the_directory_tells_the_group_when_the_socket_cannot_be_looked_at() -> None:
    g = _a_group_with_members()
    line = denied_reason("/run/memagent/memagent.sock", DENIED, stat=_stat_of({"/run/memagent": g.gr_gid}),
                         groups=lambda: [g.gr_gid], user=g.gr_mem[0])
    assert line.startswith(f"{DENIED} (you are in group {g.gr_name}:")


def test_roots_group_or_nothing_to_look_at_leaves_the_reason_as_it_was() -> None:
    assert denied_reason("/x/s", DENIED, stat=_stat_of({"/x/s": 0}), groups=lambda: []) == DENIED
    assert denied_reason("/x/s", DENIED, stat=_stat_of({}), groups=lambda: []) == DENIED
