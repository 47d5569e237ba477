"""End to end, real Austin on the second user's threaded, growing processes
(``tests/threaded_grower.py`` under the system python3): all stack work, the daemon's and
its Austin runs', is held to ``[stacks] cpu_budget`` (docs/stacks.md, docs/security.md
section 14), in the daemon's own accounting (``status``). Skipped where Austin cannot run
here."""

from __future__ import annotations

import pwd
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import HERE, Daemon, poll

from memagent.proc.austin import find_austin

GROWER = str(HERE / "threaded_grower.py")
NOTE = re.compile(r"(\d+) bursts cut, (\d+) refused")


@pytest.fixture
def growers(test_user: pwd.struct_passwd) -> Iterator[Callable[[int, int], list[int]]]:
    procs: list[subprocess.Popen[str]] = []

    def start(n: int, threads: int) -> list[int]:
        for _ in range(n):
            procs.append(subprocess.Popen(["/usr/bin/python3", GROWER, str(threads)], stdout=subprocess.PIPE,
                                          text=True, user=test_user.pw_uid, group=test_user.pw_gid,
                                          extra_groups=[], cwd="/"))
        pids = []
        for p in procs[-n:]:
            assert p.stdout is not None
            pids.append(int(p.stdout.readline().split()[2]))
        return pids

    yield start
    for p in procs:
        p.kill()
        p.wait(10)


def test_austins_cpu_is_held_to_the_budget(start_daemon: Callable[..., Daemon], tmp_path: Path,
                                           growers: Callable[[int, int], list[int]]) -> None:
    austin = find_austin()
    if austin is None or subprocess.run([austin, "--version"], capture_output=True).returncode != 0:
        pytest.skip("austin cannot run here")
    conf = tmp_path / "memagent.toml"
    conf.write_text("[stacks]\ncpu_budget = 0.02\n")  # 2 % of a core: 4 x 200 threads need more
    d = start_daemon("--config", str(conf), "--interval", "0.1", "--no-gpu", "--no-record")
    pids = growers(4, 200)
    with d.client(timeout=60) as c:
        c.attach(pids)

        def figures() -> tuple[int, int] | None:
            m = NOTE.search(c.status().stack_sampler_note or "")
            assert m is not None, c.status().stack_sampler_note
            cut, refused = int(m[1]), int(m[2])
            return (cut, refused) if cut else None

        started = time.monotonic()
        cut, _refused = poll("a burst cut at the budget", figures, timeout=60)
        status = c.status()
    assert status.stack_cpu_budget == 0.02 and cut >= 1 and status.sampler_bursts >= 1
    assert status.stack_cpu_helper_seconds > 0  # measured: the runs' own CPU (/proc/PID/stat, rusage at reap)
    assert status.stack_cpu_own_seconds > 0
    assert any("burst(s) stopped" in line for line in d.lines)
    assert time.monotonic() - started < 60 and d.proc.poll() is None
