"""``memagent record -o FILE`` against real daemons and real targets, then ``report`` and
``history --file`` over what it wrote: a spike's peak against the kernel's own VmHWM,
the points against what a second subscriber saw, the end by SIGTERM, by ``--duration``,
by the daemon's death; ``--pid``; no overwrite without ``--force``; a second user who
records only its own processes and may not read root's recorder.

Synchronisation: the recording file polled (with a deadline) for the samples it must
hold, samples awaited on a subscribed client; never a sleep.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from conftest import TEST_USER, Daemon, MiB, Target, as_user, memagent_cli, poll

from memagent.cli.main import main
from memagent.client import Client
from memproto.frames import Attached, Frame, Sample
from memproto.recording import RecordingError, SegmentReader


def frames(path: Path) -> list[Frame]:
    """What the file holds so far (a batch being written is skipped by the reader)."""
    if not path.exists() or path.stat().st_size == 0:
        return []
    with path.open("rb") as f:
        try:
            return list(SegmentReader(f, path.name))
        except RecordingError:  # the header itself not yet written whole: nothing yet
            return []


def sample_times(path: Path) -> list[float]:
    return [f.time for f in frames(path) if isinstance(f, Sample)]



@contextlib.contextmanager
def recording(d: Daemon, out: Path, *extra: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-m", "memagent.cli", "record", "--socket", d.socket, "-o", str(out),
                             "--json", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        poll("the recording's first sample", lambda: sample_times(out))
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def stop(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=15)
    return proc.returncode, out, err


def test_a_recorded_spike_reports_the_kernels_peak_and_the_samples_seen(
        daemon: Daemon, make_target: Callable[..., Target], tmp_path: Path) -> None:
    t = make_target()
    with daemon.client() as c:
        c.attach([t.pid], label="spiky")
    out = tmp_path / "run.mrec"
    seen: dict[float, int] = {}  # what a second subscriber sees of the target: time -> RSS

    def follow(c: Client, until: Callable[[Any], bool]) -> float:
        for f in c.stream():
            if isinstance(f, Sample):
                for r in f.records():
                    if r.pid == t.pid:
                        seen[f.time] = r.rss_bytes
                        if until(r):
                            return f.time
        raise AssertionError("unreachable")

    with recording(daemon, out) as rec, daemon.client() as watcher:
        watcher.subscribe()
        # The spike's window in the daemon's clock (a sample's time is its tick's start): after
        # the last sample read before the allocation, before the first one read after the free.
        before = follow(watcher, lambda r: True)
        t.do("alloc 200")
        follow(watcher, lambda r: r.rss_peak_bytes >= 200 * MiB)
        t.do("free")
        last = follow(watcher, lambda r: r.rss_bytes < 100 * MiB)
        hwm = t.status_kb("VmHWM") * 1024
        stacks = watcher.status().stack_note is None  # py-spy there: the daemon takes a stack at the peak
        if stacks:  # a stack read during the one-shot rise, or the daemon's word that none was
            reply = poll("the daemon's stack at the peak, or 'missed'",
                         lambda: (r := watcher.stack(t.pid, fresh=False)).stack_at_peak_state and r)
            stacks = reply.at_peak is not None
        poll("the last sample seen, in the file", lambda: sample_times(out)[-1] >= last)
        code, stdout, stderr = stop(rec)
    assert (code, stderr) == (0, "")
    summary = json.loads(stdout)
    assert summary["file"] == str(out) and summary["bytes"] == out.stat().st_size
    assert summary["samples"] >= len(seen) and summary["processes"] == 1

    r = memagent_cli("report", str(out), "--json")
    assert r.returncode == 0, r.stderr
    (p,) = json.loads(r.stdout)["processes"]
    assert (p["pid"], p["label"], p["peak_exact"], p["peak_before_window"]) == (t.pid, "spiky", True, False)
    assert abs(p["peak_bytes"] - hwm) <= 0.01 * hwm, (p["peak_bytes"], hwm)
    assert before < p["peak_time"] <= last
    if stacks:  # record asked for it (at the end): the target's own code, innermost first
        assert p["stack"]["frames"][0]["filename"].endswith("target_proc.py")
    # history --file: every sample the other subscriber saw, with the same value.
    r = memagent_cli("history", "--file", str(out), str(t.pid), "--json")
    (h,) = json.loads(r.stdout)
    points = {time_: rss for time_, rss, _ in h["points"]}
    assert h["source"] == "recording" and {k: points.get(k) for k in seen} == seen


def test_record_ends_with_the_daemon_and_the_file_still_reads(
        start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], tmp_path: Path) -> None:
    d = start_daemon("--interval", "0.1")
    t = make_target()
    with d.client() as c:
        c.attach([t.pid])
    out = tmp_path / "cut.mrec"
    with recording(d, out) as rec:
        poll("a few samples", lambda: len(sample_times(out)) >= 3)
        d.proc.kill()
        stdout, stderr = rec.communicate(timeout=15)
    assert rec.returncode == 1
    (line,) = stderr.splitlines()
    assert line.startswith("memagent record: the daemon went away") and f"{out} holds what came before" in line
    assert json.loads(stdout)["error"]["code"] == "connection-lost"
    r = memagent_cli("report", str(out), "--json")
    assert r.returncode == 0 and r.stderr == ""
    assert [p["pid"] for p in json.loads(r.stdout)["processes"]] == [t.pid]


def test_record_pid_filter_duration_and_no_overwrite(
        daemon: Daemon, make_target: Callable[..., Target], tmp_path: Path) -> None:
    a, b = make_target(), make_target()
    with daemon.client() as c:
        c.attach([a.pid, b.pid])
    out = tmp_path / "a.mrec"
    out.write_bytes(b"keep me")
    r = memagent_cli("--socket", daemon.socket, "record", "-o", str(out), "--duration", "0.5")
    assert r.returncode == 2 and r.stderr == f"memagent record: {out} exists (--force overwrites it)\n"
    assert out.read_bytes() == b"keep me"
    start = time.monotonic()
    r = memagent_cli("--socket", daemon.socket, "record", "-o", str(out), "--duration", "1", "--pid", str(a.pid),
                     "--force", "--json")
    assert r.returncode == 0, r.stderr
    assert 1.0 <= json.loads(r.stdout)["seconds"] <= time.monotonic() - start
    got = frames(out)
    assert {f.process.pid for f in got if isinstance(f, Attached)} == {a.pid}
    rows = {r.pid for f in got if isinstance(f, Sample) for r in f.records()}
    assert rows == {a.pid} and sum(isinstance(f, Sample) for f in got) >= 5
    # A file that cannot be created: one line, exit 1.
    r = memagent_cli("--socket", daemon.socket, "record", "-o", str(tmp_path / "no" / "x.mrec"))
    assert r.returncode == 1 and r.stderr.startswith(f"memagent record: cannot write {tmp_path}/no/x.mrec: ")


def test_another_user_records_its_own_and_may_not_read_roots_recorder(
        test_user: pwd.struct_passwd, shared_dir: str, start_daemon: Callable[..., Daemon],
        make_target: Callable[..., Target]) -> None:
    state = Path(shared_dir) / "state"
    d = start_daemon("--interval", "0.1", "--socket-group", TEST_USER, "--state-dir", str(state),
                     socket=f"{shared_dir}/m.sock")
    root_target = make_target()
    theirs = subprocess.Popen(["sleep", "600"], user=test_user.pw_uid, group=test_user.pw_gid)
    outdir = Path(shared_dir) / "out"
    outdir.mkdir()
    os.chown(outdir, test_user.pw_uid, test_user.pw_gid)
    record = state / "record"
    try:
        with d.client() as c:
            c.attach([root_target.pid], label="root-model")
        poll("root's recorder", lambda: any(record.glob("*.mrec")))
        os.chmod(state, 0o755)  # even so, record/ is the daemon's user's alone

        def unprivileged() -> dict[str, object]:
            with Client(d.socket) as uc:
                uc.attach([theirs.pid])
            out: dict[str, object] = {}
            for name, argv in (("record", ["record", "-o", f"{outdir}/mine.mrec", "--duration", "0.5"]),
                               ("report", ["report", str(record)])):
                stdout, stderr = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                    code = main(["--socket", d.socket, *argv])
                out[name] = [code, stderr.getvalue()]
            return out

        out: Any = as_user(test_user, unprivileged)
        assert out["record"] == [0, ""]
        code, err = out["report"]
        assert code == 1 and err.count("\n") == 1
        assert err.startswith(f"memagent report: cannot read the recording at {record}: permission denied")
        got = frames(outdir / "mine.mrec")
        assert {f.process.pid for f in got if isinstance(f, Attached)} == {theirs.pid}
        assert {r.pid for f in got if isinstance(f, Sample) for r in f.records()} == {theirs.pid}
    finally:
        theirs.kill()
        theirs.wait()


def test_the_flight_recorder_with_a_zero_length_segment_reads_the_rest(
        start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], tmp_path: Path) -> None:
    """A real daemon's recorder directory, with what a power loss can leave (a segment of
    zero bytes, one whose magic lost a byte) and a FIFO named like a segment: ``report``
    and ``history`` of the daemon's own recorder read its segment, one line per bad file,
    exit 0, no hang (issue 25, point 6)."""
    state = tmp_path / "state"
    d = start_daemon("--interval", "0.1", "--state-dir", str(state))
    t = make_target()
    with d.client() as c:
        c.attach([t.pid], label="model")
    record = state / "record"
    poll("the recorder's first batches", lambda: sum(
        isinstance(f, Sample) for p in record.glob("*.mrec") for f in frames(p)) >= 3)
    (record / "00000000T000000Z-000000.mrec").write_bytes(b"")
    (record / "00000000T000000Z-000001.mrec").write_bytes(b"\x89MEMREX\r\n\x1a\n" + b"\x00" * 32)
    os.mkfifo(record / "00000000T000000Z-000002.mrec")
    for argv in (["report", "--json"], ["history", "--from", "recording", "--since", "1h", "--json"]):
        r = memagent_cli("--socket", d.socket, *argv)
        assert r.returncode == 0, (argv, r.stderr)
        lines = r.stderr.splitlines()
        assert [line.split(": ")[1].rsplit("-", 1)[1] for line in lines[:3]] == [
            "000000.mrec", "000001.mrec", "000002.mrec"], lines
        assert "zero bytes" in lines[0] and "cut short or damaged" in lines[1] and "a FIFO" in lines[2]
        assert str(t.pid) in r.stdout and "Traceback" not in r.stderr
