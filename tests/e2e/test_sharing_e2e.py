"""Σ peaks follows sharing changes (issue 11): after copy-on-write writes by forked
workers, a fork, and a new process mapping the same /dev/shm segment — three changes
that leave every RSS where it was — the daemon's Σ peaks is within 10 % of the truth
within 3 s at the default interval.

The truth is measured from outside, as the team re-measures it: for each watched process
its own ``VmHWM`` minus its ``RSS - PSS`` read from its ``smaps_rollup`` now.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import pytest
from conftest import Daemon, MiB
from sharing_target import Controlled, truth

from memagent.client import Client

CONVERGE_S = 3.0
TOLERANCE = 0.10


@pytest.fixture
def sharing_targets() -> Iterator[Callable[..., Controlled]]:
    made: list[Controlled] = []

    def make(*args: str) -> Controlled:
        made.append(Controlled(*args))
        return made[-1]

    yield make
    for t in made:
        t.kill()


@pytest.fixture
def segment() -> Iterator[str]:
    path = f"/dev/shm/memagent-test-{os.getpid()}"
    yield path
    if os.path.exists(path):
        os.unlink(path)


def sum_peaks(c: Client) -> int:
    (host,) = c.status().headroom
    return host.sum_peaks_bytes


def converge(c: Client, pids: list[int], watch: float = CONVERGE_S + 1.0) -> tuple[float, int, int]:
    """Watch Σ peaks against the truth for ``watch`` seconds from now: returns when it was
    last off by more than TOLERANCE (0.0: never), and the last (Σ peaks, truth) pair. A
    change shows in the daemon's figures only some ticks later (a child's first PSS read),
    so being near at first proves nothing: what counts is the last time it was off."""
    start = time.monotonic()
    last_off = 0.0
    while True:
        got, want = sum_peaks(c), truth(pids)
        elapsed = time.monotonic() - start
        if abs(got - want) > TOLERANCE * want:
            last_off = elapsed
        if elapsed > watch:
            return last_off, got, want
        time.sleep(0.05)  # polling a figure from outside, as an operator's script does


def check(what: str, result: tuple[float, int, int]) -> None:
    last_off, got, want = result
    print(f"\n{what}: Σ peaks {got / MiB:.0f} MiB, truth {want / MiB:.0f} MiB; last off by more than "
          f"{TOLERANCE:.0%} {last_off:.2f} s after the change")
    assert last_off <= CONVERGE_S and abs(got - want) <= TOLERANCE * want, (what, result)


def settle(c: Client, pids: list[int]) -> None:
    """Every watched process's first PSS read done: Σ peaks near the truth before the change."""
    deadline = time.monotonic() + 10.0
    while abs(sum_peaks(c) - truth(pids)) > TOLERANCE * truth(pids):
        assert time.monotonic() < deadline, "Σ peaks never came near the truth"
        time.sleep(0.05)


def test_copy_on_write_pages_written_by_forked_workers(
    daemon: Daemon, sharing_targets: Callable[..., Controlled]
) -> None:
    """The truth climbs from ~1 buffer to ~4 while every RSS stays: only the host's used
    memory shows it (the drift trigger)."""
    t = sharing_targets("cow", "200", "3")
    pids = [t.pid, *t.workers]
    with daemon.client() as c:
        assert {p.pid for p in c.attach([t.pid], children=True).attached} == set(pids)
        settle(c, pids)
        before = sum_peaks(c)
        t.do("write")
        result = converge(c, pids)
    print(f"\ncow: Σ peaks {before / MiB:.0f} MiB before the writes")
    check("cow", result)
    assert result[2] > 1.6 * before  # the writes did make the pages private


@pytest.mark.parametrize("events", ["netlink", "polling"])
def test_a_fork_of_a_watched_process(events: str, start_daemon: Callable[..., Daemon],
                                     sharing_targets: Callable[..., Controlled]) -> None:
    """Parent and child now share the parent's pages: counted once, not 1.5 times. With
    kernel events the fork itself triggers; polling finds the child within a second."""
    daemon = start_daemon(*(["--no-netlink"] if events == "polling" else []))
    t = sharing_targets("hold", "300")
    with daemon.client() as c:
        c.attach([t.pid], children=True)
        settle(c, [t.pid])
        (child,) = (int(p) for p in t.do("fork"))
        result = converge(c, [t.pid, child])
        assert child in {p.pid for p in c.list() if p.alive}
    check(f"fork ({events})", result)


def test_a_new_process_mapping_the_same_shm_segment(
    daemon: Daemon, sharing_targets: Callable[..., Controlled], segment: str
) -> None:
    """Unrelated processes (no common parent) share a 300 MiB segment: the sharing key
    of the newcomer's maps leads to the first one."""
    first = sharing_targets("shm", segment, "300")
    with daemon.client() as c:
        c.attach([first.pid])
        settle(c, [first.pid])
        second = sharing_targets("shm", segment, "300")
        c.attach([second.pid])
        result = converge(c, [first.pid, second.pid])
    check("shm", result)
