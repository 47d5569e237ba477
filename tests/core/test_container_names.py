"""Container names looked up off the tick: the lookup never blocks, the thread fills the
cache and says so, the entries still without a name get it (over a fixture tree)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from proctree import ProcTree

from memagent.core.containers import ContainerNames, apply_names
from memagent.core.registry import Registry
from memagent.core.watched import Watched
from memagent.proc.cgroup_identity import parse_cgroup_identity

ID = "3f1c5e2a9b7d4c6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6"
IDENTITY = parse_cgroup_identity(f"/system.slice/docker-{ID}.scope")


def docker_tree(root: Path, name: str) -> None:
    path = root / f"var/lib/docker/containers/{ID}/config.v2.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"ID": ID, "Name": f"/{name}"}))


def test_a_lookup_returns_at_once_and_the_thread_fills_the_cache(tmp_path: Path) -> None:
    docker_tree(tmp_path, "llm-server")
    found = threading.Event()
    names = ContainerNames(str(tmp_path), found.set)
    try:
        assert names.lookup(IDENTITY) is None  # queued, not read here
        assert found.wait(10)
        assert names.cached(ID) == "llm-server" and names.lookup(IDENTITY) == "llm-server"
    finally:
        names.close()


def test_no_root_no_lookup_and_a_missing_name_is_not_retried_at_once(tmp_path: Path) -> None:
    off = ContainerNames(None)
    assert off.lookup(IDENTITY) is None and off.cached(ID) is None
    names = ContainerNames(str(tmp_path / "empty"))
    try:
        names.resolve([IDENTITY])  # the blocking form (attach by name): nothing there
        assert names.cached(ID) is None
        docker_tree(tmp_path / "empty", "late")
        assert names.lookup(IDENTITY) is None  # tried just now: not before RETRY_S
        names.resolve([IDENTITY])
        assert names.cached(ID) == "late"
    finally:
        names.close()


def test_apply_names_names_and_announces_the_entries_without_one(proc_tree: ProcTree, registry: Registry,
                                                                 tmp_path: Path) -> None:
    docker_tree(tmp_path, "asr")
    proc_tree.add_process(5001, "python3", rss=1 << 20)
    proc_tree.add_process(5002, "python3", rss=1 << 20)
    a, b = registry.attach(5001)[0], registry.attach(5002)[0]
    a.set_identity(IDENTITY, None)
    names = ContainerNames(str(tmp_path))
    names.resolve([IDENTITY])
    announced: list[Watched] = []
    assert apply_names([a, b], names, announced.append) == 1
    assert announced == [a] and a.container is not None and a.container.name == "asr"
    assert b.container is None
    assert apply_names([a, b], names, announced.append) == 0  # named once
    assert a.info().container == a.container and a.info().unit == f"docker-{ID}.scope"
