"""A broken /proc costs what it touches (issue 12): a failed attach leaves no descriptor
open, whatever failed; a bad /proc/meminfo gives the last good reading and says so.

Over a fixture /proc tree (``proctree.py``), the one stand-in for the kernel's contents;
the descriptors counted are this process's own (``/proc/self/fd``), where the agent runs."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from proctree import TRAINER, MiB, ProcTree

from memagent.core.registry import Registry
from memagent.errors import AccessDenied, CannotRead, MemagentError, NoSuchProcess, NotUserProcess
from memagent.proc.parse import parse_stat
from memagent.proc.procfs import ProcFS

ATTEMPTS = 50
#: Fields of /proc/PID/stat after ``(comm)``, counted from 0 (proc(5) numbers them from 3).
STAT_INDEX = {"ppid": 1, "flags": 6, "starttime": 19}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _garbage(name: str, data: bytes) -> Callable[[ProcTree], None]:
    return lambda tree: tree.write(TRAINER, name, data)


def _missing(name: str) -> Callable[[ProcTree], None]:
    return lambda tree: tree.path(TRAINER, name).unlink()


def _with(stat: str, field: str, value: int | str) -> str:
    """``stat`` with one field replaced."""
    close = stat.rindex(")")
    rest = stat[close + 2:].split()
    rest[STAT_INDEX[field]] = str(value)
    return f"{stat[:close + 1]} {' '.join(rest)}\n"


def _stat_field(field: str, value: int | str) -> Callable[[ProcTree], None]:
    return lambda tree: tree.write(TRAINER, "stat", _with(tree.read(TRAINER, "stat"), field, value))


def _no_btime(tree: ProcTree) -> None:
    """The box's /proc/stat, read once the process's own files all parsed."""
    (tree.root / "stat").write_text("cpu  1 2 3 4\n")


def _vanished(tree: ProcTree) -> None:
    shutil.rmtree(tree.root / str(TRAINER))


#: Each way an attach can fail after (or while) opening the process's files, and the error.
FAILURES: dict[str, tuple[Callable[[ProcTree], None], type[MemagentError]]] = {
    "garbage stat": (_garbage("stat", b"\x00garbage"), CannotRead),
    "short stat": (_garbage("stat", b"4242 (python3) S 1\n"), CannotRead),
    "stat starttime out of range": (_stat_field("starttime", "9" * 400), CannotRead),
    "kernel thread": (_stat_field("flags", 0x00200000), NotUserProcess),
    "garbage status": (_garbage("status", b"Name: x\nUid: nope\n"), CannotRead),
    "status without Uid": (_garbage("status", b"Name:\tpython3\n"), CannotRead),
    "garbage statm": (_garbage("statm", b"garbage"), CannotRead),
    "missing stat": (_missing("stat"), NoSuchProcess),
    "missing statm": (_missing("statm"), NoSuchProcess),
    "missing status": (_missing("status"), NoSuchProcess),
    "missing cmdline": (_missing("cmdline"), NoSuchProcess),
    "no btime in /proc/stat": (_no_btime, CannotRead),
    "process vanished": (_vanished, NoSuchProcess),
}


@pytest.mark.parametrize("kind", FAILURES)
def test_a_failed_attach_leaves_no_descriptor_open(proc_tree: ProcTree, kind: str) -> None:
    """Many failed attaches of one kind: an agent error each time, and as many descriptors
    open after as before (a handle holds 3: 50 leaks would be 150)."""
    break_it, error = FAILURES[kind]
    break_it(proc_tree)
    registry = Registry(proc_tree.procfs())
    before = open_fds()
    for _ in range(ATTEMPTS):
        with pytest.raises(error):
            registry.attach(TRAINER)
    assert open_fds() == before
    assert registry.entries == {}


def test_an_attach_refused_by_owner_leaves_no_descriptor_open(proc_tree: ProcTree) -> None:
    registry = Registry(proc_tree.procfs())
    before = open_fds()
    for _ in range(ATTEMPTS):
        with pytest.raises(AccessDenied):
            registry.attach(TRAINER, may_watch=lambda uid: False)
    assert open_fds() == before


@pytest.mark.e2e
def test_an_attach_of_a_reaped_process_leaves_no_descriptor_open() -> None:
    """The real /proc: a process gone (exited and reaped) before the attach."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    registry = Registry(ProcFS())
    before = open_fds()
    for _ in range(ATTEMPTS):
        with pytest.raises(NoSuchProcess):
            registry.attach(gone.pid)
    assert open_fds() == before


def test_a_good_attach_after_failed_ones_holds_its_three_descriptors(proc_tree: ProcTree) -> None:
    """The count sees a handle (the test above would catch a leak): attached, 3 more."""
    registry = Registry(proc_tree.procfs())
    before = open_fds()
    registry.attach(TRAINER)
    assert open_fds() == before + 3
    registry.close()
    assert open_fds() == before


def test_stat_fields_out_of_the_kernels_range_do_not_parse() -> None:
    good = (Path(__file__).resolve().parent.parent / "fixtures" / "proc" / str(TRAINER) / "stat").read_text()
    assert parse_stat(good.encode()).starttime > 0
    for field, value in (("starttime", "9" * 400), ("starttime", str(1 << 64)), ("starttime", "-1"),
                         ("ppid", "-5"), ("flags", str(1 << 64))):
        with pytest.raises(ValueError, match="out of range"):
            parse_stat(_with(good, field, value).encode())


# --------------------------------------------------------------------------- /proc/meminfo


MEMINFO_GARBAGE = {
    "not numbers": b"MemTotal: lots kB\nMemAvailable: some kB\n",
    "not text": b"\xff\xfe\x00\x01:\x02 3\n",
    "no MemTotal": b"MemFree: 1024 kB\n",
    "empty": b"",
}


@pytest.mark.parametrize("garbage", MEMINFO_GARBAGE)
def test_a_bad_meminfo_gives_the_last_good_reading_and_a_fault(proc_tree: ProcTree, garbage: str) -> None:
    fs = proc_tree.procfs()
    proc_tree.set_meminfo(total=1000 * MiB, available=600 * MiB)
    good = fs.meminfo()
    assert good["MemTotal"] == 1000 * MiB and fs.faults == []
    (proc_tree.root / "meminfo").write_bytes(MEMINFO_GARBAGE[garbage])
    assert fs.meminfo() == good
    (fault,) = fs.faults
    assert fault.startswith(f"{proc_tree.root / 'meminfo'} unreadable (") and "last good reading" in fault
    assert "\n" not in fault
    (proc_tree.root / "meminfo").write_text("MemTotal: 2048 kB\nMemAvailable: 1024 kB\n")
    assert fs.meminfo() == {"MemTotal": 2 * MiB, "MemAvailable": 1 * MiB} and fs.faults == []


def test_a_missing_meminfo_before_any_good_reading_is_empty_with_a_fault(proc_tree: ProcTree) -> None:
    (proc_tree.root / "meminfo").unlink()
    fs = proc_tree.procfs()
    assert fs.meminfo() == {}
    (fault,) = fs.faults
    assert "No such file or directory" in fault and "none read yet" in fault
