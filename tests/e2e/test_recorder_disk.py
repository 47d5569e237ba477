"""The flight recorder against a full disk, other users and planted links (issue 14,
docs/recording.md, docs/security.md): a real tmpfs filled up under a real daemon, a second
user, symbolic links in the state directory. Crashes and the size bound: test_recorder.py.

Synchronisation: ``status`` and the recorder's files are polled with a deadline.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, MiB, Target, as_user, fill_disk, memagent_cli, poll, small_tmpfs
from recorder_util import KiB, attach, churn, config, read_segment, segments, sequence, status

from memproto.frames import Sample
from memproto.recording import SUFFIX, open_recording

# --------------------------------------------------------------------------- full disk


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "disk", "2m") as disk:
        yield disk


def test_a_full_disk_pauses_recording_and_sampling_goes_on(
    start_daemon: Callable[..., Daemon], make_target: Callable[..., Target], small_disk: Path, tmp_path: Path
) -> None:
    cfg = config(tmp_path, "[record]\nretry_interval = 0.3\n")
    t = make_target()
    with churn(10) as pids:
        d = start_daemon("--config", cfg, "--interval", "0.05", "--state-dir", str(small_disk))
        attach(d, [*pids, t.pid])
        poll("recording", lambda: status(d).recording_bytes > 4 * KiB)
        fill_disk(small_disk / "fill")
        st = poll("paused", lambda: (s := status(d)).recording == "paused" and s)
        assert "no space left on device" in st.recording_note and "sampling goes on" in st.recording_note
        assert str(small_disk / "record") in st.recording_note
        # Sampling goes on: a peak still moves, samples still come.
        t.do("alloc 40")
        with d.client() as c:
            c.subscribe()
            row = next(r for f in c.stream() if isinstance(f, Sample) for r in f.records()
                       if r.pid == t.pid and r.rss_peak_bytes > 40 * MiB)
            assert row.alive
        time.sleep(0.7)  # two more retries, which fail: still one warning line (checked below)
        assert status(d).recording == "paused"
        (small_disk / "fill").unlink()
        poll("on again", lambda: status(d).recording == "on", timeout=5)
        grown = status(d).recording_bytes
        poll("writing again", lambda: status(d).recording_bytes > grown)
        d.stop()
    assert sum("flight recorder paused" in line for line in d.lines) == 1, d.log
    assert sum("flight recorder writing again" in line for line in d.lines) == 1, d.log
    files = segments(small_disk / "record")
    assert len(files) >= 2  # the one cut at the full disk, and the one begun after it
    for p in files:
        _, _, damage = read_segment(p)
        assert damage == [], damage  # cut back to its last whole frame, not left half-written
    peaks = [r.rss_peak_bytes for f in open_recording([str(small_disk / "record")]) if isinstance(f, Sample)
             for r in f.records() if r.pid == t.pid]
    assert max(peaks) > 40 * MiB  # recorded after the resume


# --------------------------------------------------------------------------- who may read, what is followed


def test_segments_are_private_to_the_daemons_user(
    start_daemon: Callable[..., Daemon], test_user: Any, shared_dir: str
) -> None:
    state = Path(shared_dir) / "state"
    d = start_daemon("--interval", "0.05", "--state-dir", str(state))
    record = state / "record"
    poll("a segment", lambda: segments(record))
    d.stop()
    os.chmod(state, 0o755)  # even with the state directory opened up, record/ and its files stay closed
    (seg,) = segments(record)
    assert (record.stat().st_mode & 0o777, seg.stat().st_mode & 0o777) == (0o700, 0o600)

    def try_read() -> dict[str, str]:
        out = {}
        for what, fn in (("list", lambda: os.listdir(record)), ("read", lambda: seg.read_bytes())):
            try:
                fn()
                out[what] = "read"
            except PermissionError:
                out[what] = "denied"
        return out

    assert as_user(test_user, try_read) == {"list": "denied", "read": "denied"}


def test_a_symlink_planted_as_record_is_not_followed(start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    state, elsewhere = tmp_path / "state", tmp_path / "elsewhere"
    state.mkdir(mode=0o700)
    elsewhere.mkdir()
    (state / "record").symlink_to(elsewhere)
    d = start_daemon("--interval", "0.05", "--state-dir", str(state))
    st = status(d)
    assert st.recording == "off" and "symbolic link" in (st.recording_note or "")
    assert "flight recorder: off" in memagent_cli("--socket", d.socket, "status").stdout
    d.stop()
    assert list(elsewhere.iterdir()) == []
    assert any("flight recorder off" in line and "symbolic link" in line for line in d.lines)


def test_symlinks_planted_as_segments_are_not_followed(start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    state = tmp_path / "state"
    record = state / "record"
    record.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n" * 100_000)
    planted_segment = record / f"20200101T000000Z-000001{SUFFIX}"
    planted_segment.symlink_to(victim)
    planted_part = record / f"20200101T000000Z-000002{SUFFIX}.part"
    planted_part.symlink_to(victim)
    cfg = config(tmp_path, '[record]\nmax_bytes = "1MiB"\nsegment_bytes = "4KiB"\n')
    with churn(30) as pids:
        d = start_daemon("--config", cfg, "--interval", "0.05", "--state-dir", str(state))
        attach(d, pids)
        poll("a rotation", lambda: len([p for p in segments(record) if not p.is_symlink()]) >= 2)
        d.stop()
    assert victim.read_bytes() == b"precious\n" * 100_000
    assert planted_segment.is_symlink()  # neither counted nor dropped: not the recorder's
    assert not planted_part.exists() and not planted_part.is_symlink()  # a leftover temporary: the link removed
    own = [p for p in segments(record) if not p.is_symlink()]
    assert all(p.stat().st_nlink == 1 and not p.is_symlink() for p in own)
    assert sequence(own[0]) == 1  # a link does not count as a segment of its sequence
