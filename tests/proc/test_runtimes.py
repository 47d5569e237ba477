"""Container names from fixture trees laid out as the engines lay out their files (the
JSON trimmed to the keys around the name, as they appear in real files)."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest

from memagent.proc import runtimes
from memagent.proc.runtimes import container_name

ID = "3f1c5e2a9b7d4c6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6"
OTHER = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d"


def put(root: Path, relative: str, content: object) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def cri_spec(namespace: str, pod: str, container: str) -> dict[str, object]:
    return {"ociVersion": "1.1.0", "process": {"args": ["python3", "serve.py"]}, "annotations": {
        "io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.container-name": container,
        "io.kubernetes.cri.sandbox-id": OTHER, "io.kubernetes.cri.sandbox-name": pod,
        "io.kubernetes.cri.sandbox-namespace": namespace, "io.kubernetes.cri.image-name": "docker.io/x/y:1"}}


def test_docker(tmp_path: Path) -> None:
    put(tmp_path, f"var/lib/docker/containers/{ID}/config.v2.json",
        {"ID": ID, "Name": "/llm-server", "Config": {"Image": "x"}, "State": {"Running": True, "Pid": 4242}})
    assert container_name(str(tmp_path), "docker", "docker", ID) == "llm-server"
    assert container_name(str(tmp_path), "docker", "docker", OTHER) is None


def test_podman_and_cri_o_storage_list(tmp_path: Path) -> None:
    put(tmp_path, "var/lib/containers/storage/overlay-containers/containers.json", [
        {"id": OTHER, "names": ["other"], "image": "i", "layer": "l"},
        {"id": ID, "names": ["whisper", "alias"], "image": "i", "layer": "l", "metadata": "{}"}])
    assert container_name(str(tmp_path), "podman", "podman", ID) == "whisper"
    assert container_name(str(tmp_path), "cri-o", "cri-o", ID) == "whisper"


def test_rootless_podman_is_named_from_its_users_own_storage_only(tmp_path: Path) -> None:
    me = pwd.getpwuid(os.getuid())  # a user that exists, with a home, as the daemon's lookup needs
    put(tmp_path, f"{me.pw_dir.lstrip('/')}/.local/share/containers/storage/overlay-containers/containers.json",
        [{"id": ID, "names": ["rootless-whisper"], "image": "i", "layer": "l"}])
    put(tmp_path, "var/lib/containers/storage/overlay-containers/containers.json",
        [{"id": ID, "names": ["system-says-otherwise"], "image": "i", "layer": "l"}])
    assert container_name(str(tmp_path), "podman", "podman", ID, me.pw_uid) == "rootless-whisper"
    assert container_name(str(tmp_path), "podman", "podman", ID) == "system-says-otherwise"
    assert container_name(str(tmp_path), "podman", "podman", OTHER, me.pw_uid) is None
    unknown = max(u.pw_uid for u in pwd.getpwall()) + 1
    assert container_name(str(tmp_path), "podman", "podman", ID, unknown) is None  # no such user: no name


def test_containerd_pod_in_k3s_tree(tmp_path: Path) -> None:
    put(tmp_path, f"run/k3s/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}/config.json",
        cri_spec("edge", "detector-7c9f", "yolo"))
    assert container_name(str(tmp_path), "kubernetes", None, ID) == "edge/detector-7c9f/yolo"
    assert container_name(str(tmp_path), "kubernetes", "containerd", ID) == "edge/detector-7c9f/yolo"


def test_nerdctl_in_the_default_namespace(tmp_path: Path) -> None:
    put(tmp_path, f"run/containerd/io.containerd.runtime.v2.task/default/{ID}/config.json",
        {"annotations": {"nerdctl/name": "tts", "nerdctl/namespace": "default"}})
    assert container_name(str(tmp_path), "containerd", "containerd", ID) == "tts"


def test_cri_o_pod(tmp_path: Path) -> None:
    put(tmp_path, f"run/containers/storage/overlay-containers/{ID}/userdata/config.json", {"annotations": {
        "io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.name": "asr-0",
        "io.kubernetes.container.name": "asr"}})
    assert container_name(str(tmp_path), "kubernetes", "cri-o", ID) == "default/asr-0/asr"
    assert container_name(str(tmp_path), "kubernetes", None, ID) == "default/asr-0/asr"


@pytest.mark.parametrize("content", ["", "{", "[]", '"x"', '{"Name": 3}', '{"Name": ""}', '{"Name": "/"}',
                                     "[" * 100_000])
def test_malformed_docker_files_give_no_name(tmp_path: Path, content: str) -> None:
    put(tmp_path, f"var/lib/docker/containers/{ID}/config.v2.json", content)
    assert container_name(str(tmp_path), "docker", "docker", ID) is None


@pytest.mark.parametrize("listing", [{"id": ID}, [ID], [{"id": ID, "names": []}], [{"id": ID, "names": [7]}],
                                     [{"id": ID}]])
def test_malformed_storage_lists_give_no_name(tmp_path: Path, listing: object) -> None:
    put(tmp_path, "var/lib/containers/storage/overlay-containers/containers.json", listing)
    assert container_name(str(tmp_path), "podman", "podman", ID) is None


def test_a_pod_spec_without_all_three_names_gives_none(tmp_path: Path) -> None:
    spec = cri_spec("edge", "p", "c")
    del spec["annotations"]["io.kubernetes.cri.sandbox-name"]  # type: ignore[attr-defined]
    put(tmp_path, f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}/config.json", spec)
    assert container_name(str(tmp_path), "kubernetes", "containerd", ID) is None


def test_a_file_over_the_bound_is_not_read(tmp_path: Path) -> None:
    big = put(tmp_path, f"var/lib/docker/containers/{ID}/config.v2.json", '{"Name": "/big"}')
    with big.open("a") as f:
        f.write(" " * (runtimes.MAX_BYTES + 1))
    assert container_name(str(tmp_path), "docker", "docker", ID) is None


def test_unreadable_and_missing_trees(tmp_path: Path) -> None:
    (tmp_path / "run/containerd/io.containerd.runtime.v2.task").parent.mkdir(parents=True)
    (tmp_path / "run/containerd/io.containerd.runtime.v2.task").write_text("not a directory")
    for runtime in ("docker", "podman", "containerd", "cri-o", "kubernetes"):
        assert container_name(str(tmp_path), runtime, None, ID) is None
        assert container_name(str(tmp_path / "absent"), runtime, None, ID) is None
