"""What ``attach --cgroup/--unit/--container`` matches, on cgroup paths of the shapes
``tests/proc/test_cgroup_identity.py`` covers (pure: no process needed)."""

from __future__ import annotations

import pytest

from memagent.core.groups import GroupRule, Groups, matches
from memagent.core.registry import Registry
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


CASES = [
    ("cgroup", DOCKER), ("cgroup", "/system.slice"), ("cgroup", "/system.slice/"), ("cgroup", "/"),
    ("cgroup", "/system.sl"), ("cgroup", "/kubepods/burstable"), ("unit", f"docker-{ID}.scope"),
    ("unit", "docker.service"), ("unit", "nginx.service"), ("container", ID), ("container", ID[:12]),
    ("container", ID[:11]), ("container", "llm-server"), ("container", ID.upper()[:12]),
]
PATHS = [DOCKER, POD, "/system.slice/nginx.service", "/user.slice", "/"]


@pytest.mark.parametrize("order", [1, -1])
def test_the_index_finds_the_first_rule_matches_would(order: int) -> None:
    """The index is a faster way to the same answer: for each path (and name), the first
    rule in order that :func:`matches` takes, whatever the order the rules were made in."""
    groups = Groups(Registry(), max_per_uid=10, max_rules=100)
    rules = [GroupRule(kind, value, label=str(i)) for i, (kind, value) in enumerate(CASES)][::order]
    for rule in rules:
        groups.add(rule)
    for path in PATHS:
        for name in (None, "llm-server"):
            identity = parse_cgroup_identity(path)
            expected = next((r for r in rules if matches(r.kind, r.value, path, identity, name)), None)
            assert groups.first_rule(path, identity, name) == expected, (path, name)


def test_rules_are_capped_per_uid_and_for_all_users_but_never_for_root() -> None:
    groups = Groups(Registry(), max_per_uid=3, max_rules=5)

    def users(uid: int, n: int, start: int = 0) -> list[GroupRule]:
        return [GroupRule("cgroup", f"/u{uid}/{i}", trusted=False, owner=uid) for i in range(start, start + n)]

    for rule in users(1000, 3):
        assert groups.refusal(rule) is None and groups.add(rule)
    (fourth,) = users(1000, 1, 3)
    assert "uid 1000 keeps 3 group rules already (clients.max_rules_per_uid)" in str(groups.refusal(fourth))
    assert groups.refusal(users(1000, 1)[0]) is None  # one kept already: adding it again changes nothing
    for rule in users(1001, 2):
        groups.add(rule)
    assert "5 group rules of users kept already (clients.max_rules)" in str(groups.refusal(users(1002, 1)[0]))
    for i in range(5):  # root's pool is its own: users' rules cannot fill it
        assert groups.refusal(GroupRule("unit", f"{i}.service")) is None
        groups.add(GroupRule("unit", f"{i}.service"))
    assert "root and admin_group" in str(groups.refusal(GroupRule("unit", "x.service")))
    assert groups.remove("cgroup", "/u1000/0", lambda r: True) == 1
    assert groups.count(1000) == 2 and groups.refusal(fourth) is None


def test_restored_rules_keep_each_users_first_ones_and_all_of_roots() -> None:
    saved = [GroupRule("cgroup", f"/u/{i}", trusted=False, owner=1000 + i % 2) for i in range(10)]
    saved += [GroupRule("unit", f"{i}.service") for i in range(8)]
    groups = Groups(Registry(), max_per_uid=2, max_rules=4)
    assert groups.take_back(saved) == 6
    assert groups.rules == [*saved[:4], *saved[10:]]  # root's 8: more than max_rules, all kept
