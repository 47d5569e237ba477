"""Memory cgroups (v1 ``memory`` controller or v2 unified): their limits and what they
hold (a limit is a headroom resource of its own, :mod:`memagent.alerting.limits`), and the
OOM-kill counter that tells a kernel OOM kill from a plain ``kill -9``. A cgroup is named
as :meth:`ProcFS.memory_cgroup` returns it (``memory:PATH`` for v1, ``:PATH`` for v2).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from .parse import parse_cgroup_bytes, parse_cgroup_limit, parse_memory_stat, parse_oom_kill_count

ROOT = "/sys/fs/cgroup"


def cgroup_file(cgroup: str, v1_name: str, v2_name: str, root: str = ROOT) -> str:
    """The path of a memory-controller file of a cgroup: under the v1 ``memory``
    hierarchy, or in the v2 unified tree."""
    kind, _, path = cgroup.partition(":")
    path = path.lstrip("/")
    if kind == "memory":
        return os.path.join(root, "memory", path, v1_name)
    return os.path.join(root, path, v2_name)


def _read(path: str) -> bytes | None:
    try:
        return _read_or_raise(path)
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class CgroupRead:
    """A figure read from a cgroup's files: its value (None: there is none, e.g. no limit)
    and, when a file is there but cannot be read or does not parse, why, in one line."""

    value: int | None
    fault: str | None = None


def ancestors(cgroup: str) -> list[str]:
    """The cgroup and those above it, innermost first, without the root (which has no
    limit): ``memory:/a/b`` -> ``[memory:/a/b, memory:/a]``."""
    kind, _, path = cgroup.partition(":")
    parts = [p for p in path.split("/") if p]
    return [f"{kind}:/" + "/".join(parts[:n]) for n in range(len(parts), 0, -1)]


def _figure(path: str, parse: Callable[[bytes], int | None]) -> CgroupRead:
    try:
        data = _read_or_raise(path)
    except FileNotFoundError:
        return CgroupRead(None)  # no such file: no limit there (v2: memory not enabled)
    except OSError as exc:
        return CgroupRead(None, f"{path}: {exc.strerror or exc}")
    try:
        return CgroupRead(parse(data))
    except ValueError as exc:
        return CgroupRead(None, f"{path}: {exc}")


def _read_or_raise(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def memory_limit(cgroup: str, root: str = ROOT) -> CgroupRead:
    """The memory limit of a cgroup itself (v1 ``memory.limit_in_bytes``, v2
    ``memory.max``); ``value`` None when it has none (``max``, v1's huge number, no file)."""
    return _figure(cgroup_file(cgroup, "memory.limit_in_bytes", "memory.max", root), parse_cgroup_limit)


def working_set(cgroup: str, root: str = ROOT) -> CgroupRead:
    """What a cgroup's processes use now, as ``docker stats`` and the kubelet count it: its
    usage (v1 ``memory.usage_in_bytes``, v2 ``memory.current``, both with the cgroups below
    it) less its inactive file pages (``memory.stat`` ``total_inactive_file``, v2
    ``inactive_file``), which the kernel reclaims before it would OOM-kill. Without a
    readable ``memory.stat``, the usage alone (and the fault)."""
    usage = _figure(cgroup_file(cgroup, "memory.usage_in_bytes", "memory.current", root), parse_cgroup_bytes)
    if usage.value is None:
        return usage
    key = "total_inactive_file" if cgroup.startswith("memory:") else "inactive_file"
    stat = _figure(cgroup_file(cgroup, "memory.stat", "memory.stat", root), lambda d: parse_memory_stat(d, key))
    return CgroupRead(max(0, usage.value - (stat.value or 0)), stat.fault)


def oom_kill_count(cgroup: str | None, root: str = ROOT) -> int | None:
    """The cgroup's ``oom_kill`` counter, or None when there is none to read."""
    if not cgroup:
        return None
    data = _read(cgroup_file(cgroup, "memory.oom_control", "memory.events", root))
    try:
        return parse_oom_kill_count(data) if data is not None else None
    except (ValueError, IndexError):
        return None
