"""Container names from the container engines' own files, read-only.

What a cgroup path cannot say (:mod:`memagent.proc.cgroup_identity` gives the runtime
and the ID) the engines keep on disk: Docker in ``/var/lib/docker/containers/<ID>/
config.v2.json`` (``Name``), Podman (and CRI-O) in containers/storage's
``overlay-containers/containers.json`` (``names``), containerd in each running task's
OCI bundle, ``/run/[k3s/]containerd/io.containerd.runtime.v2.task/<NAMESPACE>/<ID>/
config.json`` (the CRI annotations of a pod's container, nerdctl's ``nerdctl/name``),
CRI-O in ``/run/containers/storage/overlay-containers/<ID>/userdata/config.json``.
Rootless Podman keeps its storage in its user's home,
``~/.local/share/containers/storage`` (the user from the cgroup path: only that user's
file names that user's containers).

Every path is under ``root`` (``/`` on a box; a fixture tree in the tests). A file that
is missing, unreadable, too big or not the JSON expected gives None, never an error:
the name is a courtesy, the ID is always there. These reads may be slow (a JSON file
per container, on any disk): :class:`memagent.core.containers.ContainerNames` makes
them in a thread of its own, once per container, never on the tick.
"""

from __future__ import annotations

import json
import os
import pwd
from typing import Any

#: A runtime file larger than this is not read (an OCI spec is tens of KiB).
MAX_BYTES = 8 << 20

DOCKER = "var/lib/docker/containers/{id}/config.v2.json"
STORAGE = ("var/lib/containers/storage/overlay-containers/containers.json",
           "run/containers/storage/overlay-containers/containers.json")
CONTAINERD_TASKS = ("run/containerd/io.containerd.runtime.v2.task", "run/k3s/containerd/io.containerd.runtime.v2.task")
CRIO = "run/containers/storage/overlay-containers/{id}/userdata/config.json"
#: Under a rootless user's home (``$XDG_DATA_HOME`` elsewhere is not known to the daemon).
ROOTLESS_STORAGE = ".local/share/containers/storage/overlay-containers/containers.json"

#: Annotations (OCI spec) that name a pod's container: CRI (containerd), then CRI-O.
_POD_KEYS = (("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.cri.sandbox-name",
              "io.kubernetes.cri.container-name"),
             ("io.kubernetes.pod.namespace", "io.kubernetes.pod.name", "io.kubernetes.container.name"))


def _json(root: str, relative: str) -> Any:
    """The decoded JSON file, or None for anything short of that."""
    try:
        with open(os.path.join(root, relative), "rb") as f:
            data = f.read(MAX_BYTES + 1)
        return None if len(data) > MAX_BYTES else json.loads(data)
    except (OSError, ValueError, RecursionError):
        return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def docker_name(root: str, container_id: str) -> str | None:
    config = _json(root, DOCKER.format(id=container_id))
    name = _text(config.get("Name")) if isinstance(config, dict) else None
    return name.lstrip("/") or None if name else None


def storage_name(root: str, container_id: str, user: int | None = None) -> str | None:
    """Podman's (and CRI-O's) name from containers/storage's list of containers: the
    system's, or for a rootless container (``user``) only that user's."""
    for relative in STORAGE if user is None else _rootless(user):
        listing = _json(root, relative)
        for entry in listing if isinstance(listing, list) else ():
            if isinstance(entry, dict) and entry.get("id") == container_id:
                names = entry.get("names")
                if isinstance(names, list) and names and _text(names[0]):
                    return str(names[0])
    return None


def _rootless(user: int) -> tuple[str, ...]:
    try:
        home = pwd.getpwuid(user).pw_dir
    except (KeyError, OverflowError):
        return ()
    return (os.path.join(home.lstrip("/"), ROOTLESS_STORAGE),) if home.startswith("/") else ()


def _annotations(spec: object) -> dict[str, Any]:
    notes = spec.get("annotations") if isinstance(spec, dict) else None
    return notes if isinstance(notes, dict) else {}


def _named(notes: dict[str, Any]) -> str | None:
    for keys in _POD_KEYS:
        parts = [_text(notes.get(k)) for k in keys]
        if all(parts):
            return "/".join(p for p in parts if p)
    return _text(notes.get("nerdctl/name"))


def containerd_name(root: str, container_id: str) -> str | None:
    """From the running task's OCI bundle, in whichever containerd namespace holds it."""
    for tasks in CONTAINERD_TASKS:
        try:
            namespaces = sorted(os.listdir(os.path.join(root, tasks)))
        except OSError:
            continue
        for ns in namespaces:
            notes = _annotations(_json(root, os.path.join(tasks, ns, container_id, "config.json")))
            if notes:
                return _named(notes)
    return None


def crio_name(root: str, container_id: str) -> str | None:
    return _named(_annotations(_json(root, CRIO.format(id=container_id))))


def container_name(root: str, runtime: str, engine: str | None, container_id: str,
                   user: int | None = None) -> str | None:
    """The name people use for the container: Docker's and Podman's own, a pod's
    ``namespace/pod/container``; None when its engine's files do not say. ``user``: a
    rootless container's UID (:class:`memagent.proc.cgroup_identity.CgroupIdentity`)."""
    if runtime == "docker":
        return docker_name(root, container_id)
    if runtime == "podman":
        return storage_name(root, container_id, user)
    if runtime == "containerd":
        return containerd_name(root, container_id)
    if runtime == "cri-o":
        return crio_name(root, container_id) or storage_name(root, container_id)
    # kubernetes: the engine, when the cgroup path says it, else each in turn
    readers = {"containerd": (containerd_name,), "cri-o": (crio_name,), "docker": (docker_name,)}.get(
        engine or "", (containerd_name, crio_name, docker_name))
    return next((n for n in (read(root, container_id) for read in readers) if n), None)
