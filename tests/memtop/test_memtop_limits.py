"""memtop's header with memory cgroup limits (a container's, docs/headroom.md): one Σ peaks
gauge per limit, named, the fullest first, at most three, fed the fixed frame sequence with
a status that reports them (no clock, no socket)."""

from __future__ import annotations

from dataclasses import replace

from memtop_replay import GiB, MiB, frames

from memproto.frames import StatusOk
from memproto.records import Contributor, Headroom
from memtop.app import MemtopApp
from memtop.widgets.header import LinkState, MemHeader

DOCKER = "cgroup:/system.slice/docker-3f1c5e2a9b7d4c6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6.scope"


def limit(resource: str, name: str, sum_peaks: int, capacity: int) -> Headroom:
    return Headroom(resource, name, capacity, sum_peaks, sum_peaks / capacity if capacity else None, capacity, 0, 0,
                    False, [Contributor(4100, "resnet50-train", sum_peaks)])


async def header_lines(limits: list[Headroom], width: int = 100) -> list[str]:
    app = MemtopApp("/run/memagent/memagent.sock", connect=False)
    async with app.run_test(size=(width, 30)) as pilot:
        app.link_state = LinkState(True, "/run/memagent/memagent.sock", False, "")
        for frame in frames():
            if isinstance(frame, StatusOk):
                frame = StatusOk(frame.id, replace(frame.status, headroom=[*frame.status.headroom, *limits]))
            app.feed(frame)
        await pilot.pause()
        header = app.query_one(MemHeader)
        rendered = header.render().renderables  # type: ignore[attr-defined]
        assert header.size.height == len(rendered)  # every line on screen
        return [str(line) for line in rendered]


async def test_a_containers_limit_is_a_named_gauge_under_the_hosts() -> None:
    lines = await header_lines([limit(DOCKER, "docker web", 210 * MiB, 256 * MiB)])
    assert lines[2].startswith("Σ peaks") and "of headroom" in lines[2]  # the host's, as before
    assert lines[3].startswith("Σ limit") and "210 MiB / 256 MiB 82%" in lines[3]
    assert lines[3].rstrip().endswith("docker web")
    assert len(lines) == 4


async def test_at_most_three_limits_the_fullest_first_and_a_name_is_escaped() -> None:
    limits = [limit(f"cgroup:/c{i}", f"docker c{i}", (100 + 30 * i) * MiB, 1 * GiB) for i in range(4)]
    limits.append(limit("cgroup:/evil", "docker \x1b[2Jevil", 10 * MiB, 0))  # capacity 0: no ratio, first
    lines = await header_lines(limits, width=120)
    gauges = [line for line in lines if line.startswith("Σ limit")]
    assert len(gauges) == 3 and len(lines) == 6
    assert "docker \\x1b[2Jevil" in gauges[0] and "of n/a" in gauges[0]
    assert gauges[1].rstrip().endswith("docker c3") and "docker c2" in gauges[2]
    assert "+2 more: memagent status" in gauges[2]


async def test_the_sigma_gauges_show_what_was_seen_together_beside_the_peaks() -> None:
    """Both bounds (issue 30): Σ peaks, the worst case, and the highest total seen together."""
    seen = replace(limit(DOCKER, "docker web", 210 * MiB, 256 * MiB), observed_sum_max_bytes=120 * MiB,
                   observed_sum_max_at=1.0)
    lines = await header_lines([seen])
    assert "210 MiB / 256 MiB 82% · seen together 120 MiB" in lines[3] and "docker web" in lines[3]
    assert "seen together" not in lines[2]  # the host's, from a status without the figure (an older daemon)
