"""The packaged unit, ``packaging/memagent.service`` (docs/service.md).

* systemd's own judges: ``systemd-analyze security --offline=yes`` scores its exposure at
  most 3.0 and finds no line it cannot parse; ``systemd-analyze verify`` accepts it.
* Its limits do not break the daemon. There is no systemd here to start it, so the test
  imposes what the unit says, read from the unit itself, with the tools systemd uses
  underneath: only the capabilities of ``CapabilityBoundingSet=``, the groups of
  ``SupplementaryGroups=`` and ``NoNewPrivileges=`` (setpriv), ``PrivateTmp=`` (a mount
  namespace with its own /tmp), ``SystemCallFilter=`` with ``SystemCallErrorNumber=``,
  ``RestrictAddressFamilies=`` and ``MemoryDenyWriteExecute=`` (seccomp and PR_SET_MDWE,
  ``unit_sandbox.py``). Then everything each capability is kept for is done for real, on
  another user's process: the socket gets its group, the kernel's process events come,
  /dev/kmsg is read, py-spy reads the stack, ``reset-peaks --kernel`` resets the kernel's
  peak, and the hook starts as nobody and is killed past its timeout. A capability, group
  or syscall taken out of the unit that one of them needs fails this test. Not played:
  the read-only file system, ``DeviceAllow=``, the cgroup settings (systemd's own work).
"""

from __future__ import annotations

import ctypes.util
import os
import pwd
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Target, as_user

from memagent.client import Client
from memagent.proc.pyspy import find_py_spy

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "packaging" / "memagent.service"
DOC = ROOT / "docs" / "service.md"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")


def service_section(text: str) -> dict[str, list[str]]:
    """The ``[Service]`` settings: each key's values, in order (a key may repeat)."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


SERVICE = service_section(UNIT.read_text())


# --------------------------------------------------------------------------- systemd-analyze


@needs_analyze
def test_systemd_scores_the_units_exposure_at_most_3() -> None:
    assert ANALYZE is not None
    r = subprocess.run([ANALYZE, "security", "--offline=yes", "--threshold=30", str(UNIT)],
                       capture_output=True, text=True, timeout=60)
    score = re.search(r"Overall exposure level for memagent\.service: (\d+\.\d)", r.stdout)
    assert score is not None, r.stdout + r.stderr
    assert float(score.group(1)) <= 3.0 and r.returncode == 0, r.stdout
    assert r.stderr == "", r.stderr  # a misspelt key or a bad value is said here, and ignored by systemd


@needs_analyze
def test_systemd_verifies_the_unit(tmp_path: Path) -> None:
    """As installed: the program of ``ExecStart=`` exists (here the one being tested)."""
    assert ANALYZE is not None
    program = shlex.split(SERVICE["ExecStart"][0])[0]
    installed = Path(sys.executable).parent / "memagent"
    if not installed.exists():
        pytest.skip(f"no memagent entry point beside {sys.executable}")
    unit = tmp_path / "memagent.service"
    unit.write_text(UNIT.read_text().replace(f"ExecStart={program} ", f"ExecStart={installed} "))
    r = subprocess.run([ANALYZE, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "SYSTEMD_LOG_TARGET": "console"})
    if "System has not been booted with systemd" in r.stderr or "Failed to connect" in r.stderr:
        pytest.skip(f"systemd-analyze verify needs a running systemd here: {r.stderr.strip()}")
    assert r.returncode == 0 and r.stdout == r.stderr == "", r.stdout + r.stderr


def test_every_capability_kept_is_stated_and_explained() -> None:
    (caps,) = SERVICE["CapabilityBoundingSet"]
    comments = "\n".join(line for line in UNIT.read_text().splitlines() if line.startswith("#"))
    doc = DOC.read_text()
    for cap in caps.split():
        assert cap in comments, f"{cap}: not explained in the unit's comments"
        assert f"`{cap}`" in doc, f"{cap}: not explained in docs/service.md"
    assert SERVICE["AmbientCapabilities"] == [""] and SERVICE["NoNewPrivileges"] == ["yes"]


# --------------------------------------------------------------------------- within the unit's limits


def _tools() -> str | None:
    """Why the unit's limits cannot be imposed here, or None."""
    if os.geteuid() != 0:
        return "imposing the unit's limits needs root"
    for tool in ("setpriv", "unshare", "systemd-analyze"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if ctypes.util.find_library("seccomp") is None:
        return "libseccomp is not installed"
    if not os.path.exists("/usr/bin/python3"):
        return "no /usr/bin/python3 for another user's target"
    return None


def _mdwe_supported() -> bool:
    """PR_GET_MDWE answers (Linux 6.3 and later)."""
    return int(ctypes.CDLL(None, use_errno=True).prctl(66, 0, 0, 0, 0)) >= 0


def _daemon_argv(config: str, sock: str, group: str) -> list[str]:
    """The unit's ``ExecStart=``, with this checkout's memagent and the test's paths."""
    argv = shlex.split(SERVICE["ExecStart"][0])
    values = {"--config": config, "--socket": sock, "--socket-group": group}
    out = [sys.executable, "-m", "memagent.cli"]
    args = iter(argv[1:])
    for arg in args:
        out.append(arg)
        if arg in values:
            next(args)
            out.append(values.pop(arg))
    assert not values, f"ExecStart= lacks {sorted(values)}"
    return out


def _sandboxed(argv: list[str], group_gid: int, spare: Path) -> list[str]:
    """``argv`` under the unit's limits. ``spare``: an empty directory outside /tmp, where
    the real /tmp stays reachable when this checkout (and its venv) lives under /tmp, as
    a CI clone may: the unit's PrivateTmp would hide the daemon's own code."""
    caps = ",".join(f"+{c.lower().removeprefix('cap_')}" for c in SERVICE["CapabilityBoundingSet"][0].split())
    allow = [f for f in SERVICE["SystemCallFilter"] if not f.startswith("~")]
    deny = [f.removeprefix("~") for f in SERVICE["SystemCallFilter"] if f.startswith("~")]
    assert SERVICE["SystemCallArchitectures"] == ["native"]  # seccomp_init's default
    seccomp = [sys.executable, str(Path(__file__).with_name("unit_sandbox.py")),
               *(f"--allow={a}" for item in allow for a in item.split()),
               *(f"--deny={d}" for item in deny for d in item.split()),
               f"--families={','.join(SERVICE['RestrictAddressFamilies'][0].split())}",
               f"--errno={SERVICE['SystemCallErrorNumber'][0]}",
               *(["--mdwe"] if SERVICE.get("MemoryDenyWriteExecute") == ["yes"] and _mdwe_supported() else []),
               "--", *argv]
    setpriv = ["setpriv", "--no-new-privs", "--inh-caps=-all", f"--bounding-set=-all,{caps}",
               f"--groups={group_gid}", "--", *seccomp]
    assert SERVICE["PrivateTmp"] == ["yes"]
    private_tmp = "mount -t tmpfs tmpfs /tmp"
    if ROOT.is_relative_to("/tmp"):
        inside = ROOT.relative_to("/tmp")
        private_tmp = (f'mount --bind /tmp "{spare}" && {private_tmp} && mkdir -p "/tmp/{inside}" '
                       f'&& mount --bind "{spare}/{inside}" "/tmp/{inside}"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'{private_tmp} && exec "$@"', "sh", *setpriv]


@pytest.fixture
def run_dir() -> Iterator[Path]:
    """Outside /tmp (the daemon gets a /tmp of its own), traversable by every user."""
    path = Path(tempfile.mkdtemp(prefix="memagent-unit-", dir="/run"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _kmsg_readable() -> bool:
    try:
        os.close(os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK))
    except OSError:
        return False
    return True


def _wait_exit(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` (not a child of ours) is gone within ``timeout`` seconds."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def test_the_daemon_does_its_work_within_the_units_limits(
    test_user: pwd.struct_passwd, make_target: Callable[..., Target], run_dir: Path
) -> None:
    why = _tools()
    if why:
        pytest.skip(why)
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody for the hook")
    # The unit gives the socket the group it makes the daemon a member of: here the test user's.
    (exec_start,) = SERVICE["ExecStart"]
    assert SERVICE["SupplementaryGroups"] == [shlex.split(exec_start)[shlex.split(exec_start).index("--socket-group")
                                                                       + 1]]
    group = test_user.pw_gid
    fifo = run_dir / "hook.fifo"
    os.mkfifo(fifo)
    fifo.chmod(0o666)
    hook = run_dir / "hook.sh"  # says its PID, then outstays its timeout
    hook.write_text(f"#!/bin/sh\necho $$ > {fifo}\nexec sleep 600\n")
    hook.chmod(0o755)
    config = run_dir / "memagent.toml"
    config.write_text(f'interval = 0.2\n[host]\ncapacity = "1MiB"\n'
                      f'[alerts]\nhook = ["/bin/sh", "{hook}"]\nhook_timeout = 1\n')
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(run_dir / "notify"))
    notify.settimeout(30)
    reader = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    sock = str(run_dir / "memagent.sock")
    spare = run_dir / "real-tmp"
    spare.mkdir()
    argv = _sandboxed(_daemon_argv(str(config), sock, str(group)), group, spare)
    daemon = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "NOTIFY_SOCKET": str(run_dir / "notify")})
    hook_pid = None
    try:
        ready = notify.recv(4096).decode()
        assert ready.startswith("READY=1"), ready
        assert os.stat(sock).st_gid == group  # chgrp without CAP_CHOWN: a member of the group
        theirs = make_target(python="/usr/bin/python3", user=test_user.pw_uid, group=test_user.pw_gid,
                             extra_groups=[])
        with Client(sock) as c:
            c.attach([theirs.pid])
            status = c.status()
            if status.process_events != "netlink":  # a kernel without them, not a refusal
                assert "not permitted" not in (status.process_events_note or ""), status.process_events_note
            if find_py_spy(None) is not None:
                stack = c.stack(theirs.pid)
                assert (stack.state, stack.message) == ("ok", None)

        def reset_own_peak() -> object:
            with Client(sock) as own:
                (info,) = own.reset_peaks([theirs.pid], kernel=True).reset
                return info.rss_peak_exact

        assert as_user(test_user, reset_own_peak) is True  # clear_refs written: the kernel's peak is exact

        readable, _, _ = select.select([reader], [], [], 30)  # the hook started (the alert: 1MiB capacity)
        assert readable, "the hook did not run"
        hook_pid = int(os.read(reader, 100).split()[0])
        uid_line = next(x for x in Path(f"/proc/{hook_pid}/status").read_text().splitlines() if x.startswith("Uid:"))
        assert uid_line.split()[1:] == [str(nobody.pw_uid)] * 4
        assert _wait_exit(hook_pid, 15), "the hook outlived its timeout: the daemon could not kill it"
        hook_pid = None
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
        _, log = daemon.communicate(timeout=30)
        if hook_pid is not None and not _wait_exit(hook_pid, 0):
            os.kill(hook_pid, signal.SIGKILL)
        os.close(reader)
        notify.close()
    assert daemon.returncode == 0, log
    if _kmsg_readable():  # by root with every capability: then by the daemon with CAP_SYSLOG too
        assert "kernel log not readable" not in log, log
    assert "Traceback" not in log and "denied" not in log, log
