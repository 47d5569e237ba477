"""Units and containers from cgroup paths: one fixture file per shape
(``tests/fixtures/cgroups/``, whole ``/proc/PID/cgroup`` files, v1 and v2), read through
the same two parsers the agent uses at attach."""

from __future__ import annotations

from pathlib import Path

import pytest

from memagent.proc.cgroup_identity import CgroupIdentity, cgroup_path, parse_cgroup_identity
from memagent.proc.parse import parse_memory_cgroup

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "cgroups"
ID = "3f1c5e2a9b7d4c6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6"
POD = "0f2e4c6a-8b1d-4e3f-9a7c-5d6e7f8a9b0c"

CASES = {
    "docker-v1-cgroupfs": CgroupIdentity(None, "docker", ID, "docker"),
    "docker-v2-systemd": CgroupIdentity(f"docker-{ID}.scope", "docker", ID, "docker"),
    "docker-v2-cgroupfs": CgroupIdentity(None, "docker", ID, "docker"),
    "podman-v2-rootful": CgroupIdentity(f"libpod-{ID}.scope", "podman", ID, "podman"),
    "podman-v2-rootless-nested": CgroupIdentity(f"libpod-{ID}.scope", "podman", ID, "podman", user=1000),
    "podman-v2-conmon": CgroupIdentity(f"libpod-conmon-{ID}.scope"),
    "podman-v1-cgroupfs": CgroupIdentity(None, "podman", ID, "podman"),
    "nerdctl-v2-systemd": CgroupIdentity(f"nerdctl-{ID}.scope", "containerd", ID, "containerd"),
    "k8s-v2-systemd-containerd": CgroupIdentity(f"cri-containerd-{ID}.scope", "kubernetes", ID, "containerd", POD),
    "k8s-v2-systemd-guaranteed": CgroupIdentity(f"cri-containerd-{ID}.scope", "kubernetes", ID, "containerd", POD),
    "k8s-v2-systemd-crio": CgroupIdentity(f"crio-{ID}.scope", "kubernetes", ID, "cri-o", POD),
    "k8s-v1-cgroupfs": CgroupIdentity(None, "kubernetes", ID, None, POD),
    "k3s-v2-cgroupfs": CgroupIdentity(None, "kubernetes", ID, None, POD),
    "k8s-v2-cgroupfs-guaranteed": CgroupIdentity(None, "kubernetes", ID, None, POD),
    "systemd-service": CgroupIdentity("nginx.service"),
    "systemd-session": CgroupIdentity("session-3.scope"),
    "systemd-init": CgroupIdentity("init.scope"),
    "root-v2": CgroupIdentity(),
    "containerd-daemon": CgroupIdentity("containerd.service"),
    "lxc-v2": CgroupIdentity("cron.service"),
    "short-id": CgroupIdentity("docker-deadbeef.scope"),  # not an engine's ID: no container
    "hybrid-v1-memory-unit": CgroupIdentity("ollama.service"),
}


def test_every_fixture_has_a_case() -> None:
    assert sorted(p.name for p in FIXTURES.iterdir()) == sorted(CASES)


@pytest.mark.parametrize("shape", sorted(CASES))
def test_shape(shape: str) -> None:
    cgroup = parse_memory_cgroup((FIXTURES / shape).read_bytes())
    assert parse_cgroup_identity(cgroup_path(cgroup)) == CASES[shape]


def test_v1_uses_the_memory_controllers_line_not_the_unified_one() -> None:
    cgroup = parse_memory_cgroup((FIXTURES / "docker-v1-cgroupfs").read_bytes())
    assert cgroup == f"memory:/docker/{ID}" and cgroup_path(cgroup) == f"/docker/{ID}"


@pytest.mark.parametrize("path", [None, "", "/", "//", "/docker", f"/docker/{ID.upper()}", f"/{ID}",
                                  f"/kubepods/podnot-a-uid/{ID}", "/system.slice/.service"])
def test_odd_paths_name_nothing(path: str | None) -> None:
    ident = parse_cgroup_identity(path)
    assert ident.runtime is None and ident.container_id is None


def test_the_innermost_container_wins() -> None:
    other = "a" * 64
    ident = parse_cgroup_identity(f"/system.slice/docker-{other}.scope/docker/{ID}")
    assert (ident.runtime, ident.container_id) == ("docker", ID)
