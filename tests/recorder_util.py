"""Helpers of the flight recorder's end-to-end tests (tests/e2e/test_recorder*.py): a load
whose every row changes at every tick (``record_churn.py``), the recorder's segments on
disk, polling with a deadline."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from conftest import HERE, Daemon, memagent_cli

from memagent.store.record_files import NAME
from memproto.frames import Frame
from memproto.recording import SUFFIX, SegmentHeader, SegmentReader
from memproto.records import DaemonStatus

KiB = 1024


@contextlib.contextmanager
def churn(n: int, period: float = 0.02) -> Iterator[list[int]]:
    """``n`` processes whose RSS changes every ``period`` seconds."""
    proc = subprocess.Popen([sys.executable, str(HERE / "record_churn.py"), str(n), str(period)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        yield [int(p) for p in proc.stdout.readline().split()]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def segments(record: Path) -> list[Path]:
    return sorted(p for p in record.iterdir() if p.name.endswith(SUFFIX)) if record.is_dir() else []


def sequence(p: Path) -> int:
    m = NAME.match(p.name)
    assert m, p.name
    return int(m.group(1))


def read_segment(p: Path) -> tuple[SegmentHeader, list[Frame], list[str]]:
    with p.open("rb") as f:
        reader = SegmentReader(f, p.name)
        return reader.header, list(reader), reader.damage


def status(d: Daemon) -> DaemonStatus:
    with d.client() as c:
        return c.status()



def attach(d: Daemon, pids: list[int], *extra: str) -> None:
    r = memagent_cli("--socket", d.socket, "attach", *map(str, pids), *extra)
    assert r.returncode == 0, r.stderr


def config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "memagent.toml"
    path.write_text(text)
    return str(path)
