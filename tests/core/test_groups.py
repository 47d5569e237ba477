"""What ``attach --cgroup/--unit/--container`` matches, on cgroup paths of the shapes
``tests/proc/test_cgroup_identity.py`` covers (pure: no process needed)."""

from __future__ import annotations

import pytest

from memagent.core.groups import matches
from memagent.proc.cgroup_identity import parse_cgroup_identity

ID = "3f1c5e2a9b7d4c6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6"
DOCKER = f"/system.slice/docker-{ID}.scope"
POD = f"/kubepods/burstable/pod0f2e4c6a-8b1d-4e3f-9a7c-5d6e7f8a9b0c/{ID}"


@pytest.mark.parametrize(("kind", "value", "path", "name", "expected"), [
    ("cgroup", DOCKER, DOCKER, None, True),
    ("cgroup", "/system.slice", DOCKER, None, True),  # below it
    ("cgroup", "/system.slice/", DOCKER, None, True),
    ("cgroup", "/", DOCKER, None, True),
    ("cgroup", "/system.sl", DOCKER, None, False),  # a prefix of a name is not a parent
    ("cgroup", "/kubepods/burstable", POD, None, True),
    ("unit", f"docker-{ID}.scope", DOCKER, None, True),
    ("unit", "docker.service", DOCKER, None, False),
    ("unit", "nginx.service", "/system.slice/nginx.service", None, True),
    ("container", ID, DOCKER, None, True),
    ("container", ID[:12], POD, None, True),
    ("container", ID[:11], DOCKER, None, False),  # under 12 digits: not taken as an ID
    ("container", "llm-server", DOCKER, "llm-server", True),
    ("container", "llm-server", DOCKER, None, False),  # the name not known (yet)
    ("container", "llm-server", "/system.slice/nginx.service", "llm-server", False),  # in no container
    ("container", ID.upper()[:12], DOCKER, None, False),
])
def test_matches(kind: str, value: str, path: str, name: str | None, expected: bool) -> None:
    assert matches(kind, value, path, parse_cgroup_identity(path), name) is expected
