"""``memagent status``'s plain lines (:func:`memagent.cli.render.status_lines`) for what a
daemon with container limits reports: a cgroup's headroom line says its limit and path, a
fault (a cgroup file that does not parse) is one line, escaped."""

from __future__ import annotations

from memagent.cli.render import status_lines
from memproto.records import DaemonStatus, Headroom, HostMemory, TickStats

MiB = 1024 * 1024
GiB = 1024 * MiB


def test_a_cgroup_limit_and_a_fault_are_said() -> None:
    status = DaemonStatus(
        software="memagent 0.1.0", pid=1, uid=0, started_at=0.0, interval=0.5, socket="/run/memagent.sock",
        watched=1, alive=1, clients=1, tick=TickStats(10, 0.5, 0.001, 0, 0.0001),
        host=HostMemory(16 * GiB, 8 * GiB, 0, 0),
        headroom=[Headroom("host", "host memory", 15 * GiB, 210 * MiB, 210 / (15 * 1024), 16 * GiB, 256 * MiB,
                           1 * GiB, False, []),
                  Headroom("cgroup:/docker/3f1c", "docker web", 256 * MiB, 210 * MiB, 210 / 256, 256 * MiB, 0, 0,
                           False, [])],
        faults=["/sys/fs/cgroup/x/memory.max: not a byte count: b'lots'\nforged line"],
    )
    lines = status_lines(status)
    assert "headroom host memory: Σ peaks 210 MiB of 15.0 GiB (1%)" in lines
    assert "headroom docker web: Σ peaks 210 MiB of 256 MiB (82%); limit 256 MiB of cgroup /docker/3f1c" in lines
    assert "fault: /sys/fs/cgroup/x/memory.max: not a byte count: b'lots'\\nforged line" in lines


def test_a_user_who_sees_part_of_the_box_is_told_the_rest_counts() -> None:
    """3 of 40 watched processes are the caller's: one line says the other 37 exist and are
    in the box-wide Σ (issue 28); none when it sees them all, or from an older daemon."""
    base = dict(software="memagent 0.1.0", pid=1, uid=0, started_at=0.0, interval=0.5, socket="/s",
                alive=3, clients=1, tick=TickStats(10, 0.5, 0.001, 0, 0.0001), host=HostMemory(16 * GiB, 8 * GiB, 0, 0))
    lines = status_lines(DaemonStatus(watched=3, watched_total=40, **base))  # type: ignore[arg-type]
    assert ("  and 37 more the daemon watches that you may not see (other users'): the headroom and its Σ peaks "
            "below are the whole box's") in lines
    for total in (3, None):
        assert not any("more the daemon watches" in x for x in status_lines(
            DaemonStatus(watched=3, watched_total=total, **base)))  # type: ignore[arg-type]
