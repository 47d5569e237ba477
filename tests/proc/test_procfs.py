"""ProcFS over the fixture tree (``fixtures/proc``), and the translation of OS errors into
the agent's errors at the /proc boundary."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from memagent.errors import AccessDenied, NoSuchProcess
from memagent.proc.parse import parse_statm
from memagent.proc.procfs import CLOCK_TICKS, ProcFS, translate_errors

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "proc"
KiB = 1024
MiB = 1024 * 1024
TRAINER, ZOMBIE, WEIRD = 4242, 4243, 4244


# --------------------------------------------------------------------------- ProcFS on fixtures


@pytest.fixture
def fake_proc() -> ProcFS:
    """ProcFS over the read-only fixture tree."""
    return ProcFS(root=str(FIXTURE))


@pytest.fixture
def proc_copy(tmp_path: Path) -> Path:
    """A writable copy of the fixture tree, for tests that change it."""
    root = tmp_path / "proc"
    shutil.copytree(FIXTURE, root)
    return root


def test_procfs_pids(fake_proc: ProcFS) -> None:
    """Only numeric entries are processes; stat and meminfo are not."""
    assert sorted(fake_proc.pids()) == [TRAINER, ZOMBIE, WEIRD]


def test_procfs_stat(fake_proc: ProcFS) -> None:
    """ProcFS.stat reads the pid's stat under its root."""
    assert fake_proc.stat(TRAINER).starttime == 51234
    assert fake_proc.stat(WEIRD).comm == "(weird) name)"
    assert fake_proc.stat(ZOMBIE).state == "Z"


def test_procfs_groups(fake_proc: ProcFS) -> None:
    """ProcFS.groups: the real GID and the supplementary groups, from status."""
    assert fake_proc.groups(TRAINER) == {1000, 4, 24, 27}


def test_procfs_meminfo(fake_proc: ProcFS) -> None:
    """ProcFS.meminfo reads the tree's meminfo."""
    assert fake_proc.meminfo()["MemTotal"] == 32768000 * KiB


def test_procfs_boot_time_and_unix_start_time(fake_proc: ProcFS) -> None:
    """Start time in Unix seconds is boot time plus starttime clock ticks."""
    assert fake_proc.boot_time == 1_700_000_000
    assert fake_proc.unix_start_time(0) == 1_700_000_000.0
    assert fake_proc.unix_start_time(51234) == pytest.approx(1_700_000_000 + 51234 / CLOCK_TICKS)
    assert fake_proc.unix_start_time(CLOCK_TICKS * 90) == 1_700_000_090.0


def test_procfs_boot_time_is_read_once(proc_copy: Path) -> None:
    """Boot time cannot change; it is cached after the first read."""
    fs = ProcFS(root=str(proc_copy))
    assert fs.boot_time == 1_700_000_000
    (proc_copy / "stat").write_bytes(b"btime 1\n")
    assert fs.boot_time == 1_700_000_000
    assert ProcFS(root=str(proc_copy)).boot_time == 1


def test_procfs_missing_pid(fake_proc: ProcFS) -> None:
    """A pid with no directory is NoSuchProcess carrying the pid."""
    with pytest.raises(NoSuchProcess) as info:
        fake_proc.stat(999999)
    assert info.value.pid == 999999
    with pytest.raises(NoSuchProcess):
        fake_proc.groups(999999)


def test_procfs_process_vanishes_between_reads(proc_copy: Path) -> None:
    """A process that exits between two reads surfaces as NoSuchProcess, not FileNotFoundError."""
    fs = ProcFS(root=str(proc_copy))
    assert fs.stat(TRAINER).comm == "python3"
    shutil.rmtree(proc_copy / str(TRAINER))
    with pytest.raises(NoSuchProcess) as info:
        fs.stat(TRAINER)
    assert info.value.pid == TRAINER
    assert TRAINER not in fs.pids()
    assert fs.stat(ZOMBIE).state == "Z"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_procfs_unreadable_file_is_access_denied(proc_copy: Path) -> None:
    """A file we may not read surfaces as AccessDenied."""
    (proc_copy / str(TRAINER) / "stat").chmod(0)
    with pytest.raises(AccessDenied) as info:
        ProcFS(root=str(proc_copy)).stat(TRAINER)
    assert info.value.pid == TRAINER


# --------------------------------------------------------------------------- translate_errors


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (FileNotFoundError(errno.ENOENT, "No such file or directory"), NoSuchProcess),
        (ProcessLookupError(errno.ESRCH, "No such process"), NoSuchProcess),
        (PermissionError(errno.EACCES, "Permission denied"), AccessDenied),
        (PermissionError(errno.EPERM, "Operation not permitted"), AccessDenied),
    ],
)
def test_translate_errors(exc: OSError, expected: type[Exception]) -> None:
    """errno becomes a named error carrying the pid, so callers never inspect errno."""
    with pytest.raises(expected) as info:
        with translate_errors(4242):
            raise exc
    assert info.value.pid == 4242  # type: ignore[attr-defined]
    assert "4242" in str(info.value)


@pytest.mark.parametrize("exc", [OSError(errno.EIO, "I/O error"), OSError(errno.EMFILE, "Too many open files")])
def test_translate_errors_passes_other_os_errors(exc: OSError) -> None:
    """Errors that say nothing about the process (EIO, EMFILE) pass through unchanged."""
    with pytest.raises(OSError) as info:
        with translate_errors(4242):
            raise exc
    assert info.value is exc


def test_translate_errors_ignores_non_os_errors() -> None:
    """A parser's ValueError is not mistaken for a vanished process."""
    with pytest.raises(ValueError, match="short statm"):
        with translate_errors(4242):
            parse_statm(b"")
