"""Who a process is, read from its cgroup path: its systemd unit and its container.

Pure: a path as ``/proc/PID/cgroup`` shows it in, a :class:`CgroupIdentity` out; no
file is read, so it runs at attach and never costs the tick anything. The shapes it
knows (``tests/proc/test_cgroup_identity.py`` holds one fixture of each):

* systemd units: the innermost ``*.service`` or ``*.scope`` segment
  (``/system.slice/nginx.service``, ``/user.slice/user-1000.slice/session-3.scope``);
* Docker: ``docker-<ID>.scope`` (systemd cgroup driver) or ``/docker/<ID>`` (cgroupfs,
  v1 and v2);
* Podman: ``libpod-<ID>.scope`` (rootful and rootless, also with a nested
  ``/container`` cgroup) or ``/libpod_parent/libpod-<ID>`` (cgroupfs); ``conmon``'s own
  ``libpod-conmon-<ID>.scope`` is a unit, not the container. Rootless: under the user's
  ``user@<UID>.service``, whose UID says whose storage names it (``user``);
* containerd and CRI-O: ``cri-containerd-<ID>.scope``, ``nerdctl-<ID>.scope``,
  ``crio-<ID>.scope``;
* Kubernetes pods: ``kubepods[-QOS]-pod<UID>.slice/<runtime>-<ID>.scope`` (systemd
  driver; the UID's dashes are underscores there) and ``/kubepods[/QOS]/pod<UID>/<ID>``
  (cgroupfs, v1 and v2): runtime ``kubernetes``, whatever engine runs the pod, since its
  name is the pod's (``namespace/pod/container``).

IDs are the engines' 64 hex digits; anything else is no container (a path is data the
kernel gives, the agent does not guess).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The systemd scope prefix each engine uses, and the engine it names.
_ENGINE_OF_PREFIX = {
    "docker": "docker",
    "libpod": "podman",
    "cri-containerd": "containerd",
    "nerdctl": "containerd",
    "crio": "cri-o",
}
_SCOPE = re.compile(r"(docker|libpod|cri-containerd|nerdctl|crio)-([0-9a-f]{64})\.scope")
_LIBPOD_PLAIN = re.compile(r"libpod-([0-9a-f]{64})")
_ID = re.compile(r"[0-9a-f]{64}")
_POD = re.compile(r"(?:kubepods(?:-[a-z]+)*-)?pod([0-9a-fA-F_-]{36})(?:\.slice)?")
_UNIT = re.compile(r".+\.(?:service|scope)")
#: systemd's per-user manager: its subtree is delegated to that user (rootless engines).
_USER_MANAGER = re.compile(r"user@(\d{1,10})\.service")


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """What a cgroup path says of its processes."""

    #: The innermost systemd unit (``nginx.service``, ``docker-<ID>.scope``), or None.
    unit: str | None = None
    #: ``docker``, ``podman``, ``containerd``, ``cri-o`` or ``kubernetes``; None: none.
    runtime: str | None = None
    container_id: str | None = None
    #: The engine whose files name it (for a pod: ``containerd``, ``cri-o``, ``docker``,
    #: or None when the cgroupfs path does not say).
    engine: str | None = None
    #: A Kubernetes pod's UID (with dashes), or None.
    pod_uid: str | None = None
    #: A rootless container's user: the UID of the outermost ``user@<UID>.service`` above
    #: it (set by systemd, not by the user); None for a container of the system's.
    user: int | None = None


def cgroup_path(cgroup: str | None) -> str | None:
    """The path part of a cgroup as :meth:`ProcFS.memory_cgroup` names it
    (``memory:/docker/ID`` for v1, ``:/system.slice/x.service`` for v2)."""
    return None if cgroup is None else cgroup.partition(":")[2]


def _container(parts: list[str]) -> tuple[str, str | None, int] | None:
    """(ID, engine, segment index) of the innermost container segment."""
    for i in range(len(parts) - 1, -1, -1):
        part = parts[i]
        scope = _SCOPE.fullmatch(part)
        if scope:
            return scope.group(2), _ENGINE_OF_PREFIX[scope.group(1)], i
        plain = _LIBPOD_PLAIN.fullmatch(part)
        if plain:
            return plain.group(1), "podman", i
        if _ID.fullmatch(part) and i > 0:
            parent = parts[i - 1]
            if parent == "docker":
                return part, "docker", i
            if _POD.fullmatch(parent):
                return part, None, i
    return None


def parse_cgroup_identity(path: str | None) -> CgroupIdentity:
    """The unit and container a cgroup path names (see the module's list of shapes)."""
    if not path:
        return CgroupIdentity()
    parts = [p for p in path.split("/") if p]
    unit = next((p for p in reversed(parts) if _UNIT.fullmatch(p)), None)
    found = _container(parts)
    if found is None:
        return CgroupIdentity(unit=unit)
    container_id, engine, at = found
    pod = next((m for m in map(_POD.fullmatch, parts[:at]) if m), None)
    if pod is not None:
        return CgroupIdentity(unit, "kubernetes", container_id, engine, pod.group(1).replace("_", "-").lower())
    if engine is None:
        return CgroupIdentity(unit=unit)
    manager = next((m for m in map(_USER_MANAGER.fullmatch, parts[:at]) if m), None)
    return CgroupIdentity(unit, engine, container_id, engine, user=int(manager.group(1)) if manager else None)


def pod_uid(path: str | None) -> str | None:
    """The UID of the Kubernetes pod whose own cgroup ``path`` is (its last segment is
    ``pod<UID>`` or ``kubepods-…-pod<UID>.slice``), with dashes; None otherwise."""
    last = (path or "").rstrip("/").rpartition("/")[2]
    pod = _POD.fullmatch(last)
    return pod.group(1).replace("_", "-").lower() if pod else None


def delegated_to(path: str | None) -> int | None:
    """The UID whose systemd user manager (``user@UID.service``) holds the cgroup ``path``:
    that user may make cgroups there and name them (its units, rootless containers);
    None when the path is outside every user manager (cgroups only root makes)."""
    parts = [p for p in (path or "").split("/") if p]
    manager = next((m for m in map(_USER_MANAGER.fullmatch, parts) if m), None)
    return int(manager.group(1)) if manager else None
