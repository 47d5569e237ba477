"""The daemon as a systemd service (docs/service.md), played without systemd: a real
daemon, a real notify socket of the test's own in place of systemd's, real targets.

* sd_notify: ``READY=1`` only once the socket accepts connections, ``WATCHDOG=1`` at half
  of ``$WATCHDOG_USEC`` (and none without it), ``STOPPING=1`` on SIGTERM.
* SIGHUP: the new configuration applies live, what is watched (label, peak) stays; a key
  that needs a restart keeps its running value, said in one line; an invalid file changes
  nothing and is said in one line, the one ``check-config`` prints.
* journald: with ``$JOURNAL_STREAM`` naming its stderr, each line starts with its syslog
  priority (``<4>`` a firing warning, ``<3>`` a firing critical alert) and nothing a
  process names itself can start a line of its own.

Synchronisation: the notify datagrams, the daemon's log lines and alert frames; no sleeps.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Daemon, Target, memagent_cli, wait_sample

from memagent.client import Client
from memproto.frames import AlertRaised
from memproto.records import Alert

MiB = 1024 * 1024
GiB = 1024 * MiB


class ServiceDaemon:
    """``memagent daemon`` as systemd starts it: its stderr a pipe of ours (whose
    DEVICE:INODE a test may give as ``$JOURNAL_STREAM``), its environment ours to set."""

    def __init__(self, socket_path: str, *args: str, env: dict[str, str], journal: bool = False) -> None:
        self.socket = socket_path
        read_end, write_end = os.pipe()
        st = os.fstat(write_end)
        env = {**os.environ, **env}
        if journal:
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        self.proc = subprocess.Popen([sys.executable, "-m", "memagent.cli", "daemon", "--socket", socket_path, *args],
                                     stderr=write_end, env=env)
        os.close(write_end)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._eof = False
        self._reader = threading.Thread(target=self._read, args=(read_end,), daemon=True)
        self._reader.start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, encoding="utf-8", errors="replace") as stream:
            for line in stream:
                with self._changed:
                    self.lines.append(line.rstrip("\n"))
                    self._changed.notify_all()
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    def wait_line(self, predicate: Callable[[str], bool], after: int = 0, timeout: float = 15.0) -> str:
        """The first log line from index ``after`` on that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = next((line for line in self.lines[after:] if predicate(line)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    raise AssertionError("no such log line; the log:\n" + "\n".join(self.lines))
                self._changed.wait(left)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(15)
        self._reader.join(15)
        return rc


@pytest.fixture
def start_service(tmp_path: Path) -> Iterator[Callable[..., ServiceDaemon]]:
    started: list[ServiceDaemon] = []

    def start(*args: str, env: dict[str, str] | None = None, journal: bool = False) -> ServiceDaemon:
        d = ServiceDaemon(str(tmp_path / f"s{len(started)}.sock"), *args, env=env or {}, journal=journal)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


class NotifySocket:
    """What systemd listens on: an AF_UNIX datagram socket, at a path or abstract."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address.replace("@", "\0", 1) if address.startswith("@") else address)
        self.sock.settimeout(15)
        self.address = address
        self.seen: list[dict[str, str]] = []

    def next(self) -> dict[str, str]:
        data = self.sock.recv(4096).decode()
        fields = dict(line.split("=", 1) for line in data.split("\n"))
        self.seen.append(fields)
        return fields

    def until(self, key: str) -> dict[str, str]:
        """The next datagram that sets ``key``."""
        while True:
            fields = self.next()
            if key in fields:
                return fields

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_path(tmp_path: Path) -> Iterator[NotifySocket]:
    ns = NotifySocket(str(tmp_path / "notify"))
    yield ns
    ns.close()


@pytest.fixture
def notify_abstract(tmp_path: Path) -> Iterator[NotifySocket]:
    ns = NotifySocket(f"@memagent-test-notify-{os.getpid()}-{tmp_path.name}")
    yield ns
    ns.close()


def next_alert(c: Client, wanted: Callable[[Alert], bool], frames: int = 600) -> Alert:
    for n, frame in enumerate(c.stream()):
        if isinstance(frame, AlertRaised) and wanted(frame.alert):
            return frame.alert
        if n >= frames:
            break
    raise AssertionError("no such alert")


def firing(c: Client, *kinds: str, frames: int = 600) -> dict[str, Alert]:
    """The first firing alert of each of ``kinds``, in whatever order they come."""
    seen: dict[str, Alert] = {}
    for n, frame in enumerate(c.stream()):
        if isinstance(frame, AlertRaised) and frame.alert.kind in kinds and frame.alert.state == "firing":
            seen.setdefault(frame.alert.kind, frame.alert)
            if len(seen) == len(kinds):
                return seen
        if n >= frames:
            break
    raise AssertionError(f"alerts fired: {sorted(seen)}, not all of {kinds}")


# --------------------------------------------------------------------------- sd_notify


def test_ready_once_listening_then_watchdog_pings_and_stopping_on_sigterm(
    start_service: Callable[..., ServiceDaemon], notify_path: NotifySocket
) -> None:
    d = start_service("--interval", "0.1", "--no-stacks",
                      env={"NOTIFY_SOCKET": notify_path.address, "WATCHDOG_USEC": "400000"})
    first = notify_path.next()
    assert first.get("READY") == "1", first  # nothing before READY=1, and READY=1 first
    assert "sampling every 0.1 s" in first["STATUS"]
    with Client(d.socket) as c:  # at once, no retry: it listened before saying so
        assert c.status().pid == d.proc.pid
    pings = []
    while len(pings) < 6:
        fields = notify_path.until("WATCHDOG")
        assert fields["WATCHDOG"] == "1" and "processes watched" in fields["STATUS"]
        pings.append(time.monotonic())
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    assert max(gaps) < 1.0, gaps  # every 0.2 s (half of 0.4 s); slack for a loaded box
    d.proc.send_signal(signal.SIGTERM)
    stopping = notify_path.until("STOPPING")
    assert stopping["STOPPING"] == "1"
    assert d.proc.wait(15) == 0
    assert not any(f.get("READY") for f in notify_path.seen[1:]), notify_path.seen


# --------------------------------------------------------------------------- SIGHUP


def _config(path: Path, text: str) -> None:
    path.write_text(text)


def test_sighup_applies_the_new_configuration_and_keeps_what_is_watched(
    start_service: Callable[..., ServiceDaemon], notify_abstract: NotifySocket,
    make_target: Callable[..., Target], tmp_path: Path
) -> None:
    cfg = tmp_path / "memagent.toml"
    _config(cfg, 'interval = 0.1\n[host]\ncapacity = "8GiB"\n[alerts]\nwarn_fraction = 0.9\n')
    d = start_service("--config", str(cfg), "--no-stacks", env={"NOTIFY_SOCKET": notify_abstract.address})
    assert notify_abstract.next().get("READY") == "1"
    t = make_target()
    with Client(d.socket) as c:
        c.attach([t.pid], label="lbl")
        c.subscribe()
        t.do("alloc 30")
        peak = wait_sample(c, t.pid, lambda r: r["rss_peak_bytes"] >= 30 * MiB)["rss_peak_bytes"]  # type: ignore[operator]
        assert isinstance(peak, int)
        t.do("free")
        assert c.status().headroom[0].capacity_bytes == 8 * GiB

        # Live: the host's capacity, the warning threshold, a new budget. Not live: interval.
        _config(cfg, 'interval = 0.2\n[host]\ncapacity = "4GiB"\n[alerts]\nwarn_fraction = 0.001\n'
                     'critical_fraction = 10\n[budgets]\nlbl = "1MiB"\n')
        before = len(d.lines)
        d.proc.send_signal(signal.SIGHUP)
        assert "MONOTONIC_USEC" in notify_abstract.until("RELOADING")
        assert notify_abstract.until("READY")["STATUS"].startswith("reloaded")
        line = d.wait_line(lambda s: "reloaded" in s, after=before)
        assert f"reloaded {cfg}: applied host.capacity, alerts.warn_fraction, alerts.critical_fraction, " \
               "budgets; interval changed but only a restart applies it (running value kept)" in line, line
        alerts = firing(c, "budget", "headroom")  # the next evaluation, within a second
        assert (alerts["budget"].resource, alerts["budget"].severity) == ("lbl", "critical")
        assert (alerts["headroom"].severity, alerts["headroom"].threshold) == ("warning", 0.001)
        status = c.status()
        assert status.headroom[0].capacity_bytes == 4 * GiB
        assert status.interval == 0.1
        (info,) = c.list()  # still watched, with its label and its peak
        assert (info.pid, info.label, info.alive) == (t.pid, "lbl", True)
        assert info.rss_peak_bytes >= peak

        # Invalid: nothing changes, one line says why, in check-config's words.
        _config(cfg, 'interval = 0.1\n[host]\ncapacity = "2GiB"\n[alerts]\nwarn_fraction = "high"\n')
        check = memagent_cli("check-config", str(cfg))
        assert check.returncode != 0 and check.stderr.startswith("invalid: "), check.stderr
        reason = check.stderr.strip().removeprefix("invalid: ")
        before = len(d.lines)
        d.proc.send_signal(signal.SIGHUP)
        notify_abstract.until("RELOADING")
        assert notify_abstract.until("READY")["STATUS"].startswith("reload failed: invalid configuration: ")
        line = d.wait_line(lambda s: "reload" in s, after=before)
        assert line == f"memagent: ERROR: reload: invalid configuration: {reason}; still running on the " \
                       "previous configuration", line
        status = c.status()
        assert status.headroom[0].capacity_bytes == 4 * GiB  # not 2GiB: the file was refused whole
        assert any(a.kind == "budget" and a.resource == "lbl" for a in status.alerts_active)
        assert [(p.pid, p.label) for p in c.list()] == [(t.pid, "lbl")]
    assert d.proc.poll() is None
    assert sum("reload" in line for line in d.lines[before:]) == 1, d.lines[before:]
    assert not any("WATCHDOG" in f for f in notify_abstract.seen)  # no $WATCHDOG_USEC: no pings


def test_sighup_without_a_change_keeps_everything_and_removing_a_budget_resolves_its_alert(
    start_service: Callable[..., ServiceDaemon], notify_path: NotifySocket,
    make_target: Callable[..., Target], tmp_path: Path
) -> None:
    cfg = tmp_path / "memagent.toml"
    _config(cfg, '[budgets]\nlbl = "1MiB"\n')
    d = start_service("--config", str(cfg), "--interval", "0.1", "--no-stacks",
                      env={"NOTIFY_SOCKET": notify_path.address})
    notify_path.until("READY")
    t = make_target()
    with Client(d.socket) as c:
        c.subscribe()
        c.attach([t.pid], label="lbl")
        fired = next_alert(c, lambda a: a.kind == "budget" and a.state == "firing")
        before = len(d.lines)
        d.proc.send_signal(signal.SIGHUP)
        notify_path.until("READY")
        assert d.wait_line(lambda s: "reloaded" in s, after=before).endswith(f"reloaded {cfg}: nothing to apply")
        assert fired.id in [a.id for a in c.status().alerts_active]
        _config(cfg, "")
        d.proc.send_signal(signal.SIGHUP)
        resolved = next_alert(c, lambda a: a.kind == "budget" and a.state == "resolved")
        assert resolved.id == fired.id and "has no budget any more" in resolved.message
        assert [p.label for p in c.list()] == ["lbl"]


# --------------------------------------------------------------------------- journald


FORGED_COMM = "j\n<0>forged"  # a process name (comm): at most 15 characters


def test_journal_lines_carry_their_priority_and_alerts_theirs(
    start_service: Callable[..., ServiceDaemon], make_target: Callable[..., Target], tmp_path: Path
) -> None:
    cfg = tmp_path / "memagent.toml"
    _config(cfg, '[host]\ncapacity = "1GiB"\n[alerts]\nwarn_fraction = 0.001\ncritical_fraction = 10\n'
                 '[budgets]\nlbl = "1MiB"\n')
    d = start_service("--config", str(cfg), "--interval", "0.1", "--no-stacks", journal=True)
    d.wait_line(lambda s: "listening on" in s)
    link = tmp_path / FORGED_COMM
    link.symlink_to(os.path.realpath(sys.executable))
    forged = make_target(python=str(link))
    assert Path(f"/proc/{forged.pid}/comm").read_text() == FORGED_COMM + "\n"
    with Client(d.socket) as c:
        c.attach([forged.pid], label="lbl")
    warning = d.wait_line(lambda s: "alert headroom firing warning" in s)
    critical = d.wait_line(lambda s: "alert budget firing critical" in s)
    attached = d.wait_line(lambda s: f"attached {forged.pid}" in s)
    assert d.stop() == 0
    assert warning.startswith("<4>alert headroom firing warning [host]"), warning
    assert critical.startswith("<3>alert budget firing critical [lbl]"), critical
    assert attached == f"<6>attached {forged.pid} (j\\n<0>forged) as lbl", attached
    assert d.lines[0] == f"<6>listening on {d.socket}", d.lines
    assert d.lines[-1] == "<6>stopped", d.lines
    assert all(re.match(r"<[2-7]>\S", line) for line in d.lines), d.lines  # every line, and no <0> of the name's


def test_without_the_journal_the_lines_keep_their_plain_format(
    start_daemon: Callable[..., Daemon]
) -> None:
    # $JOURNAL_STREAM inherited from a service that started the daemon with stderr elsewhere.
    d = start_daemon("--interval", "0.1", "--no-stacks", env={**os.environ, "JOURNAL_STREAM": "8:12345"})
    assert d.stop() == 0
    assert d.lines and all(re.match(r"memagent: [A-Z]+: ", line) for line in d.lines), d.lines
