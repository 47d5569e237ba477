"""Memory cgroup limits and working sets (:mod:`memagent.proc.cgroups`) read from fixture
cgroup trees (``tests/fixtures/cgroupfs/``): v2 (``memory.max``, ``memory.current``,
``memory.stat``) and v1 (``memory.limit_in_bytes``, ``memory.usage_in_bytes``), laid out
as the kernel mounts them, with malformed files."""

from __future__ import annotations

from pathlib import Path

import pytest

from memagent.proc.cgroup_identity import pod_uid
from memagent.proc.cgroups import CgroupRead, ancestors, memory_limit, working_set
from memagent.proc.parse import parse_cgroup_bytes, parse_cgroup_limit, parse_memory_stat

TREES = Path(__file__).resolve().parent.parent / "fixtures" / "cgroupfs"
V1, V2 = str(TREES / "v1"), str(TREES / "v2")
ID = "3f1c5e2a9b7d4c6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6"
POD = ("/kubepods.slice/kubepods-burstable.slice/"
       "kubepods-burstable-pod0f2e4c6a_8b1d_4e3f_9a7c_5d6e7f8a9b0c.slice")
MiB = 1 << 20


@pytest.mark.parametrize(("text", "limit"), [
    (b"max\n", None),
    (b"1073741824\n", 1 << 30),
    (b"9223372036854771712\n", None),  # v1's "no limit"
    (b"0", 0),
])
def test_a_limit_parses(text: bytes, limit: int | None) -> None:
    assert parse_cgroup_limit(text) == limit


@pytest.mark.parametrize("text", [b"", b"lots\n", b"-1\n", b"1.5G", b"max max", b"\xff\xfe"])
def test_a_malformed_limit_is_a_value_error_saying_what_was_found(text: bytes) -> None:
    with pytest.raises(ValueError, match="not a byte count"):
        parse_cgroup_limit(text)


def test_byte_counts_and_memory_stat_fields_parse() -> None:
    assert parse_cgroup_bytes(b"734003200\n") == 734003200
    stat = b"anon 524288000\nfile 209715200\ninactive_file 104857600\n"
    assert parse_memory_stat(stat, "inactive_file") == 100 * MiB
    assert parse_memory_stat(stat, "total_inactive_file") is None
    with pytest.raises(ValueError):
        parse_memory_stat(b"inactive_file many\n", "inactive_file")


def test_v2_limits_read_from_memory_max() -> None:
    assert memory_limit(f":/system.slice/docker-{ID}.scope", V2) == CgroupRead(1 << 30)
    assert memory_limit(":/system.slice", V2) == CgroupRead(None)  # "max"
    assert memory_limit(":/system.slice/nowhere.service", V2) == CgroupRead(None)  # no file: no limit
    assert memory_limit(f":{POD}", V2) == CgroupRead(2 << 30)


def test_v1_limits_read_from_limit_in_bytes() -> None:
    assert memory_limit(f"memory:/docker/{ID}", V1) == CgroupRead(256 * MiB)
    assert memory_limit("memory:/docker", V1) == CgroupRead(None)


@pytest.mark.parametrize(("cgroup", "found"), [
    (":/bad.slice/garbage.service", "b'lots'"),
    (":/bad.slice/empty.service", "b''"),
])
def test_a_malformed_limit_file_is_a_one_line_fault_and_no_limit(cgroup: str, found: str) -> None:
    read = memory_limit(cgroup, V2)
    assert read.value is None and read.fault is not None
    assert "\n" not in read.fault and read.fault.startswith(V2) and found in read.fault


def test_the_working_set_is_usage_less_inactive_file_pages() -> None:
    # v2: memory.current 700 MiB, inactive_file 100 MiB; v1: 150 MiB, total_inactive_file 40 MiB.
    assert working_set(f":/system.slice/docker-{ID}.scope", V2) == CgroupRead(600 * MiB)
    assert working_set(f"memory:/docker/{ID}", V1) == CgroupRead(110 * MiB)
    assert working_set(":/system.slice/big.service", V2) == CgroupRead(0)  # no memory.stat: the usage
    assert working_set(":/system.slice/nowhere.service", V2) == CgroupRead(None)


def test_a_malformed_usage_or_stat_is_a_fault_not_an_error() -> None:
    garbage = working_set(":/bad.slice/garbage.service", V2)
    assert garbage.value is None and garbage.fault is not None and "b'12x'" in garbage.fault
    nostat = working_set(":/bad.slice/nostat.service", V2)  # the usage alone, and why
    assert nostat.value == 200 * MiB and nostat.fault is not None and "memory.stat" in nostat.fault


def test_ancestors_run_from_the_cgroup_up_to_below_the_root() -> None:
    assert ancestors("memory:/a/b/c") == ["memory:/a/b/c", "memory:/a/b", "memory:/a"]
    assert ancestors(":/system.slice/x.service") == [":/system.slice/x.service", ":/system.slice"]
    assert ancestors(":/") == [] and ancestors("memory:/") == []


def test_a_pods_own_cgroup_is_known_by_its_last_segment() -> None:
    assert pod_uid(POD) == "0f2e4c6a-8b1d-4e3f-9a7c-5d6e7f8a9b0c"
    assert pod_uid("/kubepods/burstable/pod0f2e4c6a-8b1d-4e3f-9a7c-5d6e7f8a9b0c") == \
        "0f2e4c6a-8b1d-4e3f-9a7c-5d6e7f8a9b0c"
    assert pod_uid(f"{POD}/cri-containerd-{ID}.scope") is None
    assert pod_uid("/kubepods.slice/kubepods-burstable.slice") is None
