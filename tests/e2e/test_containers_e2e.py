"""Who is who, end to end: real processes moved into real cgroups made by the test in the
shapes container engines use, a real daemon whose ``[containers] root`` is a fixture tree
laid out as the engine's files; no container runtime."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, Target, memagent_cli, poll, remove_cgroups

from memagent.proc.cgroup_identity import cgroup_path
from memagent.proc.parse import parse_memory_cgroup
from memproto.client_side import RequestFailed
from memproto.frames import Attached

ID = "3f1c5e2a9b7d4c6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6"
POD = "0f2e4c6a-8b1d-4e3f-9a7c-5d6e7f8a9b0c"
MakeCgroup = Callable[[str], tuple[Path, str]]


def _memory_root() -> Path | None:
    """Where memory cgroups are made: the v1 memory hierarchy, else the v2 unified tree."""
    v1 = Path("/sys/fs/cgroup/memory")
    if v1.is_dir() and (v1 / "cgroup.procs").exists():
        return v1
    v2 = Path("/sys/fs/cgroup")
    return v2 if (v2 / "cgroup.controllers").exists() else None


@pytest.fixture
def make_cgroup() -> Iterator[MakeCgroup]:
    """Make a cgroup at a path relative to a top of our own; its directory and the path
    as /proc/PID/cgroup will show it. Removed (deepest first) at the end."""
    root = _memory_root()
    if os.geteuid() != 0 or root is None:
        pytest.skip("needs root and a memory cgroup hierarchy to make cgroups in")
    top = f"memagent-test-{os.getpid()}"
    made: list[Path] = []

    def make(relative: str) -> tuple[Path, str]:
        path = root / top / relative
        try:
            path.mkdir(parents=True)
        except OSError as exc:
            pytest.skip(f"cannot make a cgroup here: {exc}")
        made.append(path)
        return path, f"/{top}/{relative}"

    yield make
    remove_cgroups(root, [p for path in made for p in (path, *path.parents) if root in p.parents])


def put(root: Path, relative: str, content: object) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content))


def daemon_over(start_daemon: Callable[..., Daemon], tmp_path: Path, root: Path) -> Daemon:
    cfg = tmp_path / "memagent.toml"
    cfg.write_text(f'[containers]\nroot = "{root}"\n')
    return start_daemon("--config", str(cfg), "--interval", "0.1", "--no-netlink")


def ls(d: Daemon) -> dict[int, dict[str, object]]:
    r = memagent_cli("ls", "--json", "--socket", d.socket)
    assert r.returncode == 0, r
    return {p["pid"]: p for p in json.loads(r.stdout)}


def test_a_docker_container_is_named_in_ls_and_in_an_attached_event(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], make_cgroup: MakeCgroup, tmp_path: Path
) -> None:
    group, path = make_cgroup(f"system.slice/docker-{ID}.scope")
    root = tmp_path / "root"
    put(root, f"var/lib/docker/containers/{ID}/config.v2.json", {"ID": ID, "Name": "/llm-server"})
    d = daemon_over(start_daemon, tmp_path, root)
    t = make_target()
    (group / "cgroup.procs").write_text(str(t.pid))
    with d.client() as c:
        c.subscribe()
        first = c.attach([t.pid]).attached[0]
        assert (first.cgroup, first.unit) == (path, f"docker-{ID}.scope")
        assert first.container is not None and (first.container.runtime, first.container.id) == ("docker", ID)
        # The name is read off the tick; once read, the process is announced again with it.
        if first.container.name is None:
            for frame in c.stream():
                if isinstance(frame, Attached) and frame.process.pid == t.pid and frame.process.container:
                    if frame.process.container.name is not None:
                        break
    got = ls(d)[t.pid]
    assert got["cgroup"] == path and got["unit"] == f"docker-{ID}.scope"
    assert got["container"] == {"runtime": "docker", "id": ID, "name": "llm-server"}
    table = memagent_cli("ls", "--socket", d.socket).stdout
    assert "CONTAINER" in table and "llm-server" in table


def test_a_pod_container_without_its_engines_files_has_no_name_and_other_processes_no_container(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], make_cgroup: MakeCgroup, tmp_path: Path
) -> None:
    group, path = make_cgroup(f"kubepods/burstable/pod{POD}/{ID}")
    d = daemon_over(start_daemon, tmp_path, tmp_path / "empty")
    boxed, plain = make_target(), make_target()
    (group / "cgroup.procs").write_text(str(boxed.pid))
    with d.client() as c:
        c.attach([boxed.pid, plain.pid])
    got = ls(d)
    assert got[boxed.pid]["cgroup"] == path
    assert got[boxed.pid]["container"] == {"runtime": "kubernetes", "id": ID, "name": None}
    assert got[plain.pid]["container"] is None
    assert got[plain.pid]["cgroup"] == cgroup_path(parse_memory_cgroup(Path(f"/proc/{plain.pid}/cgroup").read_bytes()))


# --------------------------------------------------------------------------- attach by group


def attach_cli(d: Daemon, *args: str) -> list[dict[str, Any]]:
    r = memagent_cli("attach", "--json", "--socket", d.socket, *args)
    assert r.returncode == 0, r
    return list(json.loads(r.stdout))


@pytest.mark.parametrize("how", ["cgroup", "unit", "container-name", "container-id"])
def test_attach_a_group_now_and_the_processes_that_start_in_it_later(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], make_cgroup: MakeCgroup, tmp_path: Path,
    how: str,
) -> None:
    unit = f"docker-{ID}.scope"
    group, path = make_cgroup(f"system.slice/{unit}")
    root = tmp_path / "root"
    put(root, f"var/lib/docker/containers/{ID}/config.v2.json", {"ID": ID, "Name": "/llm-server"})
    d = daemon_over(start_daemon, tmp_path, root)
    inside, outside = make_target(), make_target()
    (group / "cgroup.procs").write_text(str(inside.pid))
    flag = {"cgroup": ["--cgroup", path], "unit": ["--unit", unit], "container-name": ["--container", "llm-server"],
            "container-id": ["--container", ID[:12]]}[how]
    got = attach_cli(d, *flag, "--label", "models")
    assert [(p["pid"], p["label"]) for p in got] == [(inside.pid, "models")]
    # A process that starts in it later (the one inside forks) is attached by the scan.
    (child,) = map(int, inside.do("fork"))
    late = poll("the child attached", lambda: ls(d).get(child))
    assert late["label"] == "models" and late["cgroup"] == path
    assert outside.pid not in ls(d)


def test_attach_by_a_cgroup_above_takes_the_groups_below(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], make_cgroup: MakeCgroup, tmp_path: Path,
) -> None:
    a_group, a_path = make_cgroup(f"kubepods/burstable/pod{POD}/{ID}")
    b_group, _ = make_cgroup(f"kubepods/burstable/pod{POD}/{'e' * 64}")
    d = daemon_over(start_daemon, tmp_path, tmp_path / "empty")
    a, b = make_target(), make_target()
    (a_group / "cgroup.procs").write_text(str(a.pid))
    (b_group / "cgroup.procs").write_text(str(b.pid))
    pod = a_path.rsplit("/", 1)[0]
    assert sorted(p["pid"] for p in attach_cli(d, "--cgroup", pod + "/")) == sorted([a.pid, b.pid])
    assert attach_cli(d, "--container", "no-such-container") == []  # none now: a rule for later, not an error


def test_attach_by_group_usage_errors(daemon: Daemon) -> None:
    for args, message in ((["attach"], "give PIDs, --cgroup, --unit or --container"),
                          (["attach", "--unit", "a.service", "--cgroup", "/x"], "not allowed with")):
        r = memagent_cli(*args, "--socket", daemon.socket)
        assert r.returncode == 2 and message in r.stderr, r
    with daemon.client() as c:
        with pytest.raises(RequestFailed, match="at most one"):
            c.attach([], unit="")


@pytest.fixture
def namespaced(tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """A process that is PID 1 of a PID namespace of its own (``unshare --pid --fork``): its
    host PID, and the unshare process holding it."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a PID namespace")
    holder = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c",
                               "import time; time.sleep(120)"])
    children = Path(f"/proc/{holder.pid}/task/{holder.pid}/children")
    child = int(poll("the namespaced child", lambda: children.read_text().split()[:1] or None)[0])
    yield child, holder
    holder.kill()
    holder.wait(10)


def test_a_namespaced_pid_with_container_and_both_pids_in_ls(
    start_daemon: Callable[..., Daemon], make_cgroup: MakeCgroup, tmp_path: Path,
    namespaced: tuple[int, subprocess.Popen[bytes]],
) -> None:
    child, _ = namespaced
    group, _ = make_cgroup(f"system.slice/docker-{ID}.scope")
    (group / "cgroup.procs").write_text(str(child))
    root = tmp_path / "root"
    put(root, f"var/lib/docker/containers/{ID}/config.v2.json", {"ID": ID, "Name": "/web"})
    d = daemon_over(start_daemon, tmp_path, root)
    got = attach_cli(d, "--container", "web", "1")  # PID 1 as the container sees it
    assert [(p["pid"], p["ns_pid"]) for p in got] == [(child, 1)]
    r = memagent_cli("attach", "--json", "--socket", d.socket, "--container", "web", "7")
    assert r.returncode == 1 and "no PID 7 in container web" in r.stdout, r
    assert ls(d)[child]["ns_pid"] == 1
    with d.client() as c:  # a process in the daemon's own namespace has none
        c.attach([os.getpid()])
    assert ls(d)[os.getpid()]["ns_pid"] is None
    # The table shows it beside the host PID: 1 for the one inside, "-" for this one.
    table = memagent_cli("ls", "--socket", d.socket).stdout.splitlines()
    assert table[0].split()[:2] == ["PID", "NSPID"]
    rows = {int(line.split()[0]): line.split()[1] for line in table[1:]}
    assert (rows[child], rows[os.getpid()]) == ("1", "-")


# --------------------------------------------------------------------------- auto-attach labels


MOVER = """import os, sys
open(sys.argv[1], "w").write(str(os.getpid()))  # into the container's cgroup, then the model
os.execv(sys.executable, [sys.executable, os.path.join(sys.argv[2], "serve_" + sys.argv[3] + ".py")])
"""


def test_a_label_from_the_container_name_and_the_comm_outside(
    start_daemon: Callable[..., Daemon], make_cgroup: MakeCgroup, tmp_path: Path
) -> None:
    """``--auto-label '{container}'``: a model in a container is labelled by its name (by its
    ID's first 12 digits while the name is not read yet, then once more with the name, in a
    second ``attached`` event, whichever way the race with the name's reading goes); one
    outside any container by its comm."""
    group, _ = make_cgroup(f"system.slice/docker-{ID}.scope")
    root = tmp_path / "root"
    put(root, f"var/lib/docker/containers/{ID}/config.v2.json", {"ID": ID, "Name": "/llm-server"})
    scripts = tmp_path / "x"
    scripts.mkdir()
    for name in ("serve_web.py", "serve_plain.py"):
        (scripts / name).write_text("import time\ntime.sleep(300)\n")
    (scripts / "mover.py").write_text(MOVER)
    cfg = tmp_path / "memagent.toml"
    cfg.write_text(f'auto_cmdline = ["re:serve_(\\\\w+)\\\\.py"]\nauto_label = "{{container}}"\n'
                   f'[containers]\nroot = "{root}"\n')
    d = start_daemon("--config", str(cfg), "--interval", "0.1", "--no-netlink", "--no-stacks")
    procs = []
    try:
        with d.client() as c:
            c.subscribe()
            inside = subprocess.Popen([sys.executable, str(scripts / "mover.py"), str(group / "cgroup.procs"),
                                       str(scripts), "web"])
            outside = subprocess.Popen([sys.executable, str(scripts / "serve_plain.py")])
            procs += [inside, outside]
            labels: list[str | None] = []
            for frame in c.stream():
                if isinstance(frame, Attached) and frame.process.pid == inside.pid:
                    labels.append(frame.process.label)
                    if frame.process.label != ID[:12]:
                        break
        assert labels[-1] == "llm-server" and set(labels[:-1]) <= {ID[:12]}, labels
        got = poll("the one outside attached", lambda: (w := ls(d)).get(outside.pid) and w)
        assert got[inside.pid]["label"] == "llm-server"
        assert got[outside.pid]["label"] == got[outside.pid]["name"]
    finally:
        for p in procs:
            p.kill()
            p.wait()
