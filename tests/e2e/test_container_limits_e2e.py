"""A container's memory limit as a headroom resource of its own, end to end: a real cgroup
with a real limit made by the test in Docker's shape (the v1 ``memory`` hierarchy, else the
v2 tree), a real target moved into it, a real daemon whose ``[containers] root`` names the
container; no container runtime. What a client sees of it: ``status --json``, the plain
``status``, the alert, the Prometheus endpoint, and the flight recorder's headroom frames."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Daemon, Target, free_port, memagent_cli, poll, remove_cgroups, scrape

from memproto.recording import HeadroomSnapshot, open_recording
from memproto.records import DaemonStatus, Headroom

ID = "5e6f7a8b9c0d1e2f3a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9a0b"
MiB = 1024 * 1024
LIMIT = 256 * MiB


class Limited:
    """A cgroup ``system.slice/docker-<ID>.scope`` under a top of the test's own, limited
    to :data:`LIMIT`; ``path`` as /proc/PID/cgroup shows it."""

    def __init__(self, root: Path, v1: bool) -> None:
        self.root = root
        self.top = root / f"memagent-limit-{os.getpid()}"
        self.dir = self.top / "system.slice" / f"docker-{ID}.scope"
        self.path = f"/{self.top.name}/system.slice/docker-{ID}.scope"
        self.dir.mkdir(parents=True)
        if v1:
            (self.dir / "memory.limit_in_bytes").write_text(str(LIMIT))
        else:
            for d in (self.root, self.top, self.top / "system.slice"):  # the memory controller, down to it
                (d / "cgroup.subtree_control").write_text("+memory")
            (self.dir / "memory.max").write_text(str(LIMIT))

    def put(self, pid: int) -> None:
        (self.dir / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        remove_cgroups(self.root, [self.dir, self.dir.parent, self.top])


@pytest.fixture
def limited() -> Iterator[Limited]:
    v1 = Path("/sys/fs/cgroup/memory")
    v2 = Path("/sys/fs/cgroup")
    if os.geteuid() != 0:
        pytest.skip("needs root to make cgroups")
    is_v1 = (v1 / "cgroup.procs").exists()
    if not is_v1 and "memory" not in (v2 / "cgroup.controllers").read_text(errors="replace").split():
        pytest.skip("no memory cgroup controller")
    try:
        group = Limited(v1 if is_v1 else v2, is_v1)
    except OSError as exc:
        pytest.skip(f"cannot make a limited cgroup here: {exc}")
    try:
        yield group
    finally:
        group.remove()


def entries(d: Daemon) -> dict[str, Headroom]:
    with d.client() as c:
        status: DaemonStatus = c.status()
    return {h.resource: h for h in status.headroom}


def test_a_containers_limit_is_its_own_headroom_and_its_alert_names_the_container(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], limited: Limited, tmp_path: Path
) -> None:
    names = tmp_path / "root" / "var/lib/docker/containers" / ID
    names.mkdir(parents=True)
    (names / "config.v2.json").write_text(json.dumps({"ID": ID, "Name": "/web"}))
    cfg = tmp_path / "memagent.toml"
    port = free_port()
    cfg.write_text(f'[containers]\nroot = "{tmp_path / "root"}"\n[alerts]\nwarn_fraction = 0.75\n')
    d = start_daemon("--config", str(cfg), "--interval", "0.1", "--metrics", f"127.0.0.1:{port}",
                     "--state-dir", str(tmp_path / "state"))
    inside, outside = make_target(), make_target()
    limited.put(inside.pid)
    with d.client() as c:
        c.attach([inside.pid, outside.pid])
    resource = f"cgroup:{limited.path}"

    # Its entry, named once the container's name is read; only it: the other target is in
    # no limited cgroup.
    view = poll("the container's entry, named", lambda: (h := entries(d).get(resource)) and
                h.name == "docker web" and h)
    assert view.limit_bytes == LIMIT and view.capacity_bytes <= LIMIT and view.reserve_bytes == 0
    host_before = entries(d)["host"]
    assert [r for r in entries(d) if r.startswith("cgroup:")] == [resource]
    assert [c.pid for c in view.top] == [inside.pid]

    # Grown to ~80 % of the limit: a warning for the container, not for the host.
    inside.do("alloc 200")
    peak = poll("the target's peak in the container's Σ",
                lambda: (h := entries(d)[resource]).sum_peaks_bytes >= 200 * MiB and h)
    assert peak.top[0].pid == inside.pid and peak.top[0].peak_bytes >= 200 * MiB

    def firing() -> list[dict[str, object]]:
        out = json.loads(memagent_cli("status", "--json", "--socket", d.socket).stdout)
        return [a for a in out["alerts_active"] if a["kind"] == "headroom"]

    (alert,) = poll("a headroom warning for the container", firing)
    assert (alert["resource"], alert["severity"]) == (resource, "warning")
    assert str(alert["message"]).startswith("container web: Σ peaks ")
    assert " limit; seen together at most " in str(alert["message"])  # both bounds (issue 30)
    host = entries(d)["host"]
    assert host.limit_bytes == host_before.limit_bytes  # the host's own limit, the box's memory
    assert f"firing warning [{resource}]: container web: Σ peaks" in d.log

    plain = memagent_cli("status", "--socket", d.socket).stdout
    assert "headroom docker web: Σ peaks" in plain and f"of cgroup {limited.path}" in plain
    assert f"ALERT warning headroom [{resource}]: container web:" in plain
    _, _, metrics = scrape(port)
    assert f'memagent_headroom_ratio{{resource="{resource}"}}' in metrics
    assert f'memagent_headroom_resource_info{{resource="{resource}",name="docker web"}} 1' in metrics
    assert f'memagent_alert_firing{{kind="headroom",resource="{resource}",severity="warning"}} 1' in metrics

    # The flight recorder keeps it in its headroom frames, named.
    assert d.stop() == 0
    recorded = [h for f in open_recording([str(tmp_path / "state" / "record")]) if isinstance(f, HeadroomSnapshot)
                for h in f.headroom if h.resource == resource]
    assert recorded and recorded[-1].name == "docker web" and recorded[-1].sum_peaks_bytes >= 200 * MiB
