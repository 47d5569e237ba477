"""The /proc layer: parsers against fixture files, ProcFS over a fixture tree, handles on
real processes, and the peak-preserving history fed by them.

Fixtures under ``fixtures/proc`` are edited copies of real /proc files (psutil style), so
the parsers are pinned to the kernel's actual formats, including awkward cases: a zombie
without Vm* lines and a comm with spaces and parentheses.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memagent.errors import AccessDenied, NoSuchProcess, NotUserProcess
from memagent.proc.parse import (
    MAX_ARG_CHARS,
    MAX_CMDLINE_CHARS,
    Stat,
    Statm,
    StatusMemory,
    parse_btime,
    parse_cmdline,
    parse_meminfo,
    parse_stat,
    parse_statm,
    parse_status_groups,
    parse_status_memory,
    parse_status_uid,
)
from memagent.proc.procfs import CLOCK_TICKS, PAGE_SIZE, ProcFS, translate_errors
from memproto.series import PeakSeries as PeakHistory

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "proc"
KiB = 1024
MiB = 1024 * 1024
TRAINER, ZOMBIE, WEIRD = 4242, 4243, 4244


def fixture(*parts: object) -> bytes:
    """Bytes of a fixture file."""
    return FIXTURE.joinpath(*(str(p) for p in parts)).read_bytes()


# --------------------------------------------------------------------------- parsers


def test_parse_statm() -> None:
    """statm's first three fields are size, resident and shared pages."""
    statm = parse_statm(fixture(TRAINER, "statm"))
    assert statm == Statm(size=301234, resident=131072, shared=9876)
    assert statm.anon == 131072 - 9876


def test_parse_statm_of_a_zombie() -> None:
    """A zombie's statm is all zeros, not an error."""
    statm = parse_statm(fixture(ZOMBIE, "statm"))
    assert statm == Statm(0, 0, 0)
    assert statm.anon == 0


def test_statm_anon_never_negative() -> None:
    """shared can exceed resident in a racy read; anon is clamped at zero."""
    assert Statm(size=10, resident=3, shared=5).anon == 0


@pytest.mark.parametrize("data", [b"", b"12 34\n", b"\n"])
def test_parse_statm_refuses_short_input(data: bytes) -> None:
    """A truncated statm is an error, not zeros."""
    with pytest.raises(ValueError, match="short statm"):
        parse_statm(data)


def test_parse_status_memory_in_bytes() -> None:
    """VmHWM, VmRSS and VmSwap are reported in kB and returned in bytes."""
    assert parse_status_memory(fixture(TRAINER, "status")) == StatusMemory(
        hwm_bytes=812344 * KiB, rss_bytes=524288 * KiB, swap_bytes=2048 * KiB
    )


def test_parse_status_memory_of_a_zombie() -> None:
    """A zombie has no Vm* lines: every value is None, not 0."""
    assert parse_status_memory(fixture(ZOMBIE, "status")) == StatusMemory(None, None, None)


def test_parse_status_memory_does_not_match_inside_other_keys() -> None:
    """Keys are matched at line starts: RssAnon and friends never pass for VmRSS."""
    data = b"Name:\tx\nRssVmRSS:\t 1 kB\nVmRSS:\t 7 kB\nVmHWM:\t 9 kB\n"
    assert parse_status_memory(data) == StatusMemory(9 * KiB, 7 * KiB, None)


def test_parse_status_memory_last_line_without_newline() -> None:
    """A value on the very last line, without a trailing newline, is still read."""
    assert parse_status_memory(b"Name:\tx\nVmSwap:\t  12 kB").swap_bytes == 12 * KiB


def test_parse_status_uid() -> None:
    """The real UID is the first of the four Uid fields."""
    assert parse_status_uid(fixture(TRAINER, "status")) == 1000
    assert parse_status_uid(fixture(WEIRD, "status")) == 1001
    data = b"Name:\tsu\nUid:\t1000\t0\t0\t0\n"
    assert parse_status_uid(data) == 1000


def test_parse_status_uid_requires_the_line() -> None:
    """A status without Uid is an error rather than uid 0 (which would mean root)."""
    with pytest.raises(ValueError, match="Uid"):
        parse_status_uid(b"Name:\tx\nGid:\t0\t0\t0\t0\n")


def test_parse_status_groups() -> None:
    """Groups are the supplementary ones plus the real GID."""
    assert parse_status_groups(fixture(TRAINER, "status")) == {1000, 4, 24, 27}
    assert parse_status_groups(fixture(ZOMBIE, "status")) == {1000}


def test_parse_status_groups_empty_supplementary_list() -> None:
    """An empty ``Groups:`` line leaves only the real GID."""
    assert parse_status_groups(fixture(WEIRD, "status")) == {100}


def test_parse_status_of_this_process() -> None:
    """On the real kernel's format, UID and groups match what os reports."""
    data = Path("/proc/self/status").read_bytes()
    assert parse_status_uid(data) == os.getuid()
    assert parse_status_groups(data) == {os.getgid(), *os.getgroups()}
    mem = parse_status_memory(data)
    assert mem.rss_bytes is not None and mem.hwm_bytes is not None
    assert 0 < mem.rss_bytes <= mem.hwm_bytes


def test_parse_stat() -> None:
    """comm, state, ppid, flags and starttime come from the right columns."""
    assert parse_stat(fixture(TRAINER, "stat")) == Stat(
        comm="python3", state="S", ppid=4100, flags=4194560, starttime=51234
    )


def test_parse_stat_of_a_zombie() -> None:
    """A zombie's stat is parsed like any other."""
    assert parse_stat(fixture(ZOMBIE, "stat")) == Stat("worker", "Z", 4242, 4227148, 52129)


def test_parse_stat_comm_with_spaces_and_parentheses() -> None:
    """comm is user-controlled: a name like '(weird) name)' must not shift the columns."""
    stat = parse_stat(fixture(WEIRD, "stat"))
    assert stat == Stat(comm="(weird) name)", state="R", ppid=4242, flags=4194368, starttime=60000)


def test_parse_stat_of_a_kernel_thread() -> None:
    """kthreadd carries PF_KTHREAD in its flags."""
    stat = parse_stat(b"2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 24 0 0 "
                      b"18446744073709551615 0 0 0 0 0 0 0 2147483647 0 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n")
    assert stat.flags & 0x00200000
    assert (stat.comm, stat.ppid, stat.starttime) == ("kthreadd", 0, 24)


def test_parse_stat_of_this_process() -> None:
    """Against the real kernel: our own ppid and state."""
    stat = parse_stat(Path("/proc/self/stat").read_bytes())
    assert stat.ppid == os.getppid()
    assert stat.state == "R"
    assert stat.starttime > 0


@pytest.mark.parametrize("data", [b"", b"4242 python3 S 1", b"4242 )python3( S 1"])
def test_parse_stat_refuses_malformed(data: bytes) -> None:
    """A stat without a well-formed (comm) is refused."""
    with pytest.raises(ValueError, match="malformed stat"):
        parse_stat(data)


def test_parse_cmdline() -> None:
    """argv is NUL-separated; the trailing NUL does not make an empty argument."""
    assert parse_cmdline(fixture(TRAINER, "cmdline")) == [
        "python3", "-m", "train", "--epochs=3", "--data=/srv/data set",
    ]
    assert parse_cmdline(fixture(WEIRD, "cmdline")) == ["./weird", "--name=(weird) name)"]


def test_parse_cmdline_of_a_zombie() -> None:
    """A zombie (or a kernel thread) has an empty cmdline."""
    assert parse_cmdline(fixture(ZOMBIE, "cmdline")) == []


def test_parse_cmdline_invalid_utf8() -> None:
    """Arguments are bytes; undecodable ones are shown with replacement characters."""
    assert parse_cmdline(b"prog\0caf\xe9\0") == ["prog", "caf\ufffd"]


def test_parse_cmdline_truncates_a_long_argument() -> None:
    """One huge argument (an inline JSON config) is cut to MAX_ARG_CHARS, ending in '…'."""
    long = "x" * (MAX_ARG_CHARS * 5)
    args = parse_cmdline(b"python3\0-c\0" + long.encode() + b"\0--next\0")
    assert args[:2] == ["python3", "-c"]
    assert len(args[2]) == MAX_ARG_CHARS
    assert args[2] == long[: MAX_ARG_CHARS - 1] + "…"
    assert args[3] == "--next"


def test_parse_cmdline_argument_at_the_limit_is_kept() -> None:
    """An argument of exactly MAX_ARG_CHARS is not cut."""
    arg = "y" * MAX_ARG_CHARS
    assert parse_cmdline(arg.encode() + b"\0") == [arg]


def test_parse_cmdline_truncates_a_long_command_line() -> None:
    """Thousands of arguments (a glob expanded on the command line) end in a single '…'."""
    files = [f"/data/shard-{i:05d}.parquet" for i in range(5000)]
    args = parse_cmdline(b"\0".join(f.encode() for f in ["cat", *files]) + b"\0")
    assert args[-1] == "…"
    kept = args[:-1]
    assert kept == ["cat", *files][: len(kept)]
    assert sum(map(len, kept)) <= MAX_CMDLINE_CHARS
    assert sum(map(len, kept)) + len(files[len(kept) - 1]) > MAX_CMDLINE_CHARS


def test_parse_meminfo() -> None:
    """kB values become bytes; unitless counts (HugePages_*) stay counts."""
    info = parse_meminfo(fixture("meminfo"))
    assert info["MemTotal"] == 32768000 * KiB
    assert info["MemAvailable"] == 24576000 * KiB
    assert info["SwapTotal"] == 8388604 * KiB
    assert info["SwapFree"] == 8126460 * KiB
    assert info["HugePages_Total"] == 16
    assert info["Active(anon)"] > 0


def test_parse_meminfo_of_this_machine() -> None:
    """The real file parses, with the keys the status reply needs."""
    info = parse_meminfo(Path("/proc/meminfo").read_bytes())
    assert 0 < info["MemAvailable"] <= info["MemTotal"]
    assert info["SwapFree"] <= info["SwapTotal"]


def test_parse_btime() -> None:
    """Boot time is the btime line of /proc/stat."""
    assert parse_btime(fixture("stat")) == 1_700_000_000


def test_parse_btime_missing() -> None:
    """Without btime no start time can be computed: an error, not 0."""
    with pytest.raises(ValueError, match="btime"):
        parse_btime(b"cpu  1 2 3\nctxt 5\nbtimex 7\n")


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


def test_procfs_status(fake_proc: ProcFS) -> None:
    """ProcFS.status returns the raw file for the status parsers."""
    assert parse_status_uid(fake_proc.status(TRAINER)) == 1000


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
        fake_proc.status(999999)


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


# --------------------------------------------------------------------------- real processes


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A real process that does nothing until killed."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_procfs_pids_lists_real_processes(sleeper: subprocess.Popen[bytes]) -> None:
    """On the real /proc, our pid and our child's are listed."""
    pids = ProcFS().pids()
    assert os.getpid() in pids
    assert sleeper.pid in pids


def test_handle_on_a_real_process(sleeper: subprocess.Popen[bytes]) -> None:
    """A handle pins the process's identity and reads its files through open descriptors."""
    handle = ProcFS().open(sleeper.pid)
    try:
        assert handle.pid == sleeper.pid
        assert handle.starttime == parse_stat(Path(f"/proc/{sleeper.pid}/stat").read_bytes()).starttime
        statm = parse_statm(handle.statm_bytes())
        assert statm.resident > 0
        status = handle.status_bytes()
        assert status.startswith(b"Name:\tsleep\n")
        assert parse_status_uid(status) == os.getuid()
        mem = parse_status_memory(status)
        assert mem.rss_bytes is not None and mem.rss_bytes > 0
        assert parse_cmdline(handle.read("cmdline")) == ["sleep", "600"]
        assert handle.stat().ppid == os.getpid()
        # pread rereads from offset 0: a second read gives the whole file again, not EOF.
        again = handle.statm_bytes()
        assert again.endswith(b"\n")
        assert len(again.split()) == 7
    finally:
        handle.close()
    assert handle.closed


def test_real_start_time_is_now(sleeper: subprocess.Popen[bytes]) -> None:
    """Boot time plus starttime ticks gives the Unix time the child was started."""
    fs = ProcFS()
    started = fs.unix_start_time(fs.stat(sleeper.pid).starttime)
    assert fs.boot_time == parse_btime(Path("/proc/stat").read_bytes())
    assert abs(started - time.time()) < 60


def test_handle_reads_fail_after_the_process_exits() -> None:
    """Reads on a handle whose process has been reaped raise NoSuchProcess, never stale data."""
    proc = subprocess.Popen(["sleep", "600"])
    handle = ProcFS().open(proc.pid)
    try:
        assert handle.statm_bytes()
        proc.kill()
        proc.wait()
        for read in (handle.statm_bytes, handle.status_bytes, handle.stat, lambda: handle.read("cmdline")):
            with pytest.raises(NoSuchProcess) as info:
                read()
            assert info.value.pid == proc.pid
    finally:
        handle.close()


def test_handle_close_is_idempotent(sleeper: subprocess.Popen[bytes]) -> None:
    """Closing twice (an error path and a finally) must not close someone else's descriptor."""
    handle = ProcFS().open(sleeper.pid)
    handle.close()
    handle.close()
    assert handle.closed


def test_open_nonexistent_pid() -> None:
    """Opening a pid that does not exist is NoSuchProcess."""
    proc = subprocess.Popen(["true"])
    proc.wait()  # reaped: its pid is free (and not reused this quickly)
    with pytest.raises(NoSuchProcess) as info:
        ProcFS().open(proc.pid)
    assert info.value.pid == proc.pid
    with pytest.raises(NoSuchProcess):
        ProcFS().open(2**22 + 1)  # above pid_max's ceiling


def test_open_kernel_thread_is_refused() -> None:
    """A kernel thread has no memory of its own to watch."""
    try:
        stat = parse_stat(Path("/proc/2/stat").read_bytes())
    except FileNotFoundError:
        pytest.skip("no pid 2 in this PID namespace")
    if stat.comm != "kthreadd":
        pytest.skip(f"pid 2 is {stat.comm!r}, not kthreadd, in this PID namespace")
    with pytest.raises(NotUserProcess) as info:
        ProcFS().open(2)
    assert info.value.pid == 2


#: Allocates and touches 100 MiB, frees it, says "ready", then waits for stdin to close.
PEAK_CHILD = """
import sys
n = 100 * 1024 * 1024
block = bytearray(n)
block[::4096] = b"\\x01" * len(range(0, n, 4096))
del block
print("ready", flush=True)
sys.stdin.read()
"""


def test_clear_refs_resets_the_high_water_mark() -> None:
    """Writing 5 to clear_refs makes VmHWM restart from the current RSS: reset-peaks' mechanism."""
    child = subprocess.Popen(
        [sys.executable, "-c", PEAK_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None
    handle = ProcFS().open(child.pid)
    try:
        assert child.stdout.readline() == "ready\n"
        before = parse_status_memory(handle.status_bytes())
        assert before.hwm_bytes is not None and before.rss_bytes is not None
        assert before.hwm_bytes >= 100 * MiB
        assert before.rss_bytes < before.hwm_bytes - 80 * MiB

        handle.write("clear_refs", b"5")

        after = parse_status_memory(handle.status_bytes())
        assert after.hwm_bytes is not None and after.rss_bytes is not None
        assert after.hwm_bytes < 50 * MiB
        assert after.rss_bytes <= after.hwm_bytes <= after.rss_bytes + 4 * MiB
    finally:
        handle.close()
        child.stdin.close()
        assert child.wait(timeout=30) == 0


# --------------------------------------------------------------------------- PeakHistory

P = PAGE_SIZE


def test_history_starts_empty() -> None:
    """Before any sample there is no series and no end time."""
    history = PeakHistory(step=1.0, slots=10)
    assert history.series() == (0.0, [])
    assert len(history) == 0


@pytest.mark.parametrize(("step", "slots"), [(0, 10), (-1.0, 10), (1.0, 0), (1.0, -5)])
def test_history_refuses_bad_geometry(step: float, slots: int) -> None:
    """A zero step or capacity is a configuration error."""
    with pytest.raises(ValueError):
        PeakHistory(step=step, slots=slots)


def test_history_keeps_the_max_within_a_slot() -> None:
    """Downsampling must never hide a peak: a slot keeps its largest sample."""
    history = PeakHistory(step=1.0, slots=10)
    for now, pages in [(100.1, 5), (100.4, 9), (100.9, 3)]:
        history.add(now, pages * P)
    assert history.series() == (101.0, [9 * P])
    assert len(history) == 1


def test_history_rounds_to_kib() -> None:
    """Values are stored in KiB: a partial KiB is dropped (RSS is whole pages anyway)."""
    history = PeakHistory(step=1.0, slots=4)
    history.add(0.0, 3 * P + 1536)
    assert history.series()[1] == [3 * P + 1024]


def test_history_fills_gaps_with_the_new_value() -> None:
    """Slots skipped by a late tick take the value sampled after them."""
    history = PeakHistory(step=1.0, slots=10)
    history.add(100.0, 2 * P)
    history.add(103.5, 7 * P)
    assert history.series() == (104.0, [2 * P, 7 * P, 7 * P, 7 * P])
    assert len(history) == 4


def test_history_series_seconds_bounds_the_window() -> None:
    """series(seconds) returns the most recent slots covering at least that long."""
    history = PeakHistory(step=1.0, slots=10)
    for t in range(6):
        history.add(float(t), (t + 1) * P)
    assert history.series(2) == (6.0, [5 * P, 6 * P])
    assert history.series(2.5) == (6.0, [4 * P, 5 * P, 6 * P])
    assert history.series(0) == (6.0, [6 * P])
    assert history.series(1000) == (6.0, [(t + 1) * P for t in range(6)])
    assert history.series(None) == history.series(1000)


def test_history_series_seconds_with_fractional_step() -> None:
    """The window is counted in slots of ``step`` seconds."""
    history = PeakHistory(step=0.5, slots=20)
    for i in range(10):
        history.add(i * 0.5, (i + 1) * P)
    end, values = history.series(2.0)
    assert end == 5.0
    assert values == [7 * P, 8 * P, 9 * P, 10 * P]


def test_history_wraps_around_at_capacity() -> None:
    """Past its capacity the buffer keeps only the newest slots, oldest first."""
    history = PeakHistory(step=1.0, slots=4)
    for t in range(10):
        history.add(float(t), t * P)
    assert history.series() == (10.0, [6 * P, 7 * P, 8 * P, 9 * P])
    assert len(history) == 4


def test_history_gap_longer_than_capacity() -> None:
    """A gap longer than the whole buffer replaces all of it."""
    history = PeakHistory(step=1.0, slots=4)
    history.add(0.0, 1 * P)
    history.add(1.0, 2 * P)
    history.add(100.0, 5 * P)
    assert history.series() == (101.0, [5 * P] * 4)
    assert len(history) == 4


def test_history_ignores_a_clock_going_backwards() -> None:
    """A sample from an earlier slot is dropped: the history stays monotonic."""
    history = PeakHistory(step=1.0, slots=10)
    history.add(10.0, 5 * P)
    history.add(11.0, 6 * P)
    history.add(5.0, 100 * P)
    assert history.series() == (12.0, [5 * P, 6 * P])
    history.add(11.5, 8 * P)  # same slot as the last one: still counts
    assert history.series() == (12.0, [5 * P, 8 * P])


def test_history_load_and_points_round_trip() -> None:
    """A client loads a received series and charts it: same values, slot end times."""
    source = PeakHistory(step=1.0, slots=10)
    for t, v in [(100.2, 5 * P), (101.5, 7 * P), (101.9, 9 * P), (103.0, 4 * P)]:
        source.add(t, v)
    end, values = source.series()
    copy = PeakHistory(step=1.0, slots=10)
    copy.load(end, values)
    assert copy.series() == (end, values)
    assert copy.points() == [(101.0, 5 * P), (102.0, 9 * P), (103.0, 4 * P), (104.0, 4 * P)]


def test_history_end_time_is_the_end_of_the_last_slot() -> None:
    """end_time is when the last slot ends, on the step grid, not the sample's time."""
    history = PeakHistory(step=0.5, slots=10)
    history.add(10.2, P)
    assert history.series()[0] == 10.5
    history.add(10.74, P)
    assert history.series()[0] == 11.0
    hourly = PeakHistory(step=60.0, slots=60)
    hourly.add(1_700_000_012.0, P)
    assert hourly.series()[0] == (1_700_000_012.0 // 60 + 1) * 60


def test_history_clamps_huge_values() -> None:
    """A value beyond 2**32 KiB saturates instead of raising OverflowError in the sampler."""
    history = PeakHistory(step=1.0, slots=2)
    history.add(0.0, 2**33 * 1024)
    assert history.series()[1] == [0xFFFFFFFF * 1024]
