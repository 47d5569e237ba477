"""The /proc parsers against fixture files.

Fixtures under ``fixtures/proc`` are edited copies of real /proc files (psutil style), so
the parsers are pinned to the kernel's actual formats, including awkward cases: a zombie
without Vm* lines and a comm with spaces and parentheses.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memagent.proc.parse import (
    MAX_ARG_CHARS,
    MAX_CMDLINE_CHARS,
    Stat,
    Statm,
    StatusMemory,
    parse_anon_excess,
    parse_btime,
    parse_cmdline,
    parse_meminfo,
    parse_shared_excess,
    parse_shared_resident,
    parse_stat,
    parse_statm,
    parse_status_groups,
    parse_status_memory,
    parse_status_nspid,
    parse_status_uid,
    parse_thread_cpu,
)

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "proc"
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


#: smaps_rollup of a forked worker sharing its parent's 200 MiB (Linux 6.1's fields).
SMAPS_ROLLUP = b"""55d5c2a4d000-7ffc8a5f0000 ---p 00000000 00:00 0                          [rollup]
Rss:              210944 kB
Pss:               72201 kB
Pss_Dirty:         70000 kB
Pss_Anon:          70012 kB
Pss_File:           2189 kB
Pss_Shmem:             0 kB
Shared_Clean:       4120 kB
Shared_Dirty:     204800 kB
Private_Clean:         0 kB
Private_Dirty:      2024 kB
Anonymous:        206800 kB
"""


def test_smaps_rollup_excess_and_shared_resident() -> None:
    assert parse_shared_excess(SMAPS_ROLLUP) == (210944 - 72201) * KiB
    assert parse_shared_resident(SMAPS_ROLLUP) == (4120 + 204800) * KiB
    assert parse_shared_resident(b"Rss: 10 kB\n") is None  # an old kernel's, or a truncated read
    # Forked workers' copy-on-write pages: the anonymous part of the excess.
    assert parse_anon_excess(SMAPS_ROLLUP) == (206800 - 70012) * KiB
    assert parse_anon_excess(b"Rss: 10 kB\nAnonymous: 8 kB\n") is None  # before Linux 5.9: no Pss_Anon


@pytest.mark.parametrize(("status", "expected"), [
    (b"Name:\tpython3\nNSpid:\t4242\nNSpgid:\t4242\n", None),  # the reader's own namespace
    (b"Name:\tpython3\nNSpid:\t4242\t1\n", 1),  # PID 1 of a container
    (b"Name:\tpython3\nNSpid:\t4242\t77\t5\n", 5),  # nested twice: the innermost
    (b"Name:\tpython3\n", None),  # a kernel without NSpid (before 4.1)
])
def test_parse_status_nspid(status: bytes, expected: int | None) -> None:
    assert parse_status_nspid(status) == expected


def test_thread_cpu_is_utime_plus_stime_and_a_comm_with_parentheses_is_no_trouble() -> None:
    line = b"4242 (a (b) c) S 1 4242 4242 0 -1 4194560 10 0 0 0 37 5 0 0 20 0 1 0 100 0 0\n"
    assert parse_thread_cpu(line) == 42
    with pytest.raises(ValueError):
        parse_thread_cpu(b"garbage")
