"""Memory cgroups (v1 ``memory`` controller or v2 unified): the limit the watched
processes share, and the OOM-kill counter that tells a kernel OOM kill from a plain
``kill -9``. A cgroup is named as :meth:`ProcFS.memory_cgroup` returns it
(``memory:PATH`` for v1, ``:PATH`` for v2).
"""

from __future__ import annotations

import os

from .parse import parse_cgroup_limit, parse_oom_kill_count

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
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def cgroup_limit(cgroup: str, root: str = ROOT) -> int | None:
    """The memory limit of a cgroup; None when unlimited or unreadable."""
    data = _read(cgroup_file(cgroup, "memory.limit_in_bytes", "memory.max", root))
    try:
        return parse_cgroup_limit(data) if data is not None else None
    except ValueError:
        return None


def oom_kill_count(cgroup: str | None, root: str = ROOT) -> int | None:
    """The cgroup's ``oom_kill`` counter, or None when there is none to read."""
    if not cgroup:
        return None
    data = _read(cgroup_file(cgroup, "memory.oom_control", "memory.events", root))
    try:
        return parse_oom_kill_count(data) if data is not None else None
    except (ValueError, IndexError):
        return None
