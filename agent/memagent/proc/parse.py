"""Parsers of the /proc (and cgroup) files the agent reads: bytes in, values out.

Pure functions, tested against fixture files that are edited copies of real ones
(psutil style). Malformed input raises ``ValueError``; the handles in
:mod:`memagent.proc.procfs` turn that into :class:`~memagent.errors.CannotRead` for
their callers, so nothing above this package parses /proc or catches ``ValueError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: cmdline is user data of any length; keep what a human reads, bounded for the wire.
MAX_ARG_CHARS: Final = 1024
MAX_CMDLINE_CHARS: Final = 8192
_PF_KTHREAD: Final = 0x00200000
_U64: Final = 1 << 64


@dataclass(frozen=True, slots=True)
class Statm:
    """``/proc/PID/statm``, in pages."""

    size: int
    resident: int
    shared: int

    @property
    def anon(self) -> int:
        """Anonymous resident pages: statm's ``shared`` is file-backed + shmem pages."""
        return max(0, self.resident - self.shared)


def parse_statm(data: bytes) -> Statm:
    parts = data.split(None, 3)
    if len(parts) < 3:
        raise ValueError(f"short statm: {data[:64]!r}")
    return Statm(int(parts[0]), int(parts[1]), int(parts[2]))


@dataclass(frozen=True, slots=True)
class StatusMemory:
    """The ``/proc/PID/status`` lines the hot path needs, in bytes. ``None``: line absent
    (a zombie or a kernel thread has no Vm* lines)."""

    hwm_bytes: int | None
    rss_bytes: int | None
    swap_bytes: int | None


def _kb_field(data: bytes, key: bytes) -> int | None:
    i = data.find(key)
    if i < 0:
        return None
    j = data.find(b"\n", i + 1)
    # "VmHWM:\t  123456 kB"
    return int(data[i + len(key) : j if j >= 0 else None].split()[0]) * 1024


def parse_status_memory(data: bytes) -> StatusMemory:
    return StatusMemory(
        _kb_field(data, b"\nVmHWM:"),
        _kb_field(data, b"\nVmRSS:"),
        _kb_field(data, b"\nVmSwap:"),
    )


def parse_status_uid(data: bytes) -> int:
    """Real UID from the ``Uid:`` line (real, effective, saved, filesystem)."""
    i = data.find(b"\nUid:")
    if i < 0:
        raise ValueError("status has no Uid line")
    return int(data[i + 5 : data.find(b"\n", i + 1)].split()[0])


def parse_status_uids(data: bytes) -> tuple[int, int, int, int]:
    """Real, effective, saved and filesystem UID from the ``Uid:`` line."""
    i = data.find(b"\nUid:")
    if i < 0:
        raise ValueError("status has no Uid line")
    fields = data[i + 5 : data.find(b"\n", i + 1)].split()
    return int(fields[0]), int(fields[1]), int(fields[2]), int(fields[3])


def parse_status_nspid(data: bytes) -> int | None:
    """The PID in the process's own PID namespace (the last of ``NSpid:``) when that is a
    namespace nested in the reader's (the line has more than one PID); else None."""
    i = data.find(b"\nNSpid:")
    if i < 0:
        return None
    fields = data[i + 7 : data.find(b"\n", i + 1)].split()
    return int(fields[-1]) if len(fields) > 1 else None


def parse_status_groups(data: bytes) -> set[int]:
    """Supplementary groups plus the real GID, from ``Groups:`` and ``Gid:``."""
    groups: set[int] = set()
    for key in (b"\nGid:", b"\nGroups:"):
        i = data.find(key)
        if i >= 0:
            fields = data[i + len(key) : data.find(b"\n", i + 1)].split()
            groups.update(int(x) for x in (fields[:1] if key == b"\nGid:" else fields))
    return groups


@dataclass(frozen=True, slots=True)
class Stat:
    """The fields of ``/proc/PID/stat`` the agent uses."""

    comm: str
    state: str
    ppid: int
    flags: int
    #: Clock ticks after boot: with the PID, the identity of a process.
    starttime: int


def parse_stat(data: bytes) -> Stat:
    # comm is in parentheses and may itself contain spaces and parentheses.
    open_ = data.find(b"(")
    close = data.rfind(b")")
    if open_ < 0 or close < open_:
        raise ValueError(f"malformed stat: {data[:64]!r}")
    comm = data[open_ + 1 : close].decode("utf-8", "replace")
    rest = data[close + 2 :].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    stat = Stat(comm, rest[0].decode(), int(rest[1]), int(rest[6]), int(rest[19]))
    # The kernel prints these unsigned, starttime as a 64-bit count of clock ticks: a
    # value outside that range is garbage, and a huge one would overflow the float of a
    # start time above this package (OverflowError, not ValueError).
    if not (0 <= stat.ppid < _U64 and 0 <= stat.flags < _U64 and 0 <= stat.starttime < _U64):
        raise ValueError(f"stat field out of range: {data[:64]!r}")
    return stat


def parse_cmdline(data: bytes) -> list[str]:
    """NUL-separated argv, bounded: long arguments and long command lines are cut with '…'."""
    if not data:
        return []
    args = data.rstrip(b"\0").split(b"\0")
    out: list[str] = []
    total = 0
    for raw in args:
        arg = raw.decode("utf-8", "replace")
        if len(arg) > MAX_ARG_CHARS:
            arg = arg[: MAX_ARG_CHARS - 1] + "…"
        if total + len(arg) > MAX_CMDLINE_CHARS:
            out.append("…")
            break
        total += len(arg)
        out.append(arg)
    return out


def parse_meminfo(data: bytes) -> dict[str, int]:
    """``/proc/meminfo`` as bytes per key."""
    out: dict[str, int] = {}
    for line in data.splitlines():
        key, _, value = line.partition(b":")
        fields = value.split()
        if fields:
            n = int(fields[0])
            out[key.decode()] = n * 1024 if len(fields) > 1 and fields[1] == b"kB" else n
    return out


def parse_btime(data: bytes) -> int:
    """Boot time (Unix seconds) from ``/proc/stat``."""
    for line in data.splitlines():
        if line.startswith(b"btime "):
            return int(line.split()[1])
    raise ValueError("no btime in /proc/stat")


def parse_thread_cpu(data: bytes) -> int:
    """utime + stime (clock ticks) of one ``/proc/PID/task/TID/stat``: compared between two
    readings, whether the thread ran in between."""
    close = data.rfind(b")")
    if close < 0:
        raise ValueError(f"malformed stat: {data[:64]!r}")
    rest = data[close + 2:].split()
    # rest[0] is field 3 (state); utime and stime are fields 14 and 15.
    return int(rest[11]) + int(rest[12])


def parse_statm_pages(raw: bytes) -> tuple[int, int] | None:
    """``(resident, shared)`` pages from raw statm for the sampler's hot loop (no object
    built); None for a zombie, whose mm is gone (size 0)."""
    parts = raw.split(None, 3)
    if parts[0] == b"0":
        return None
    return int(parts[1]), int(parts[2])


def is_kernel_thread(stat: Stat) -> bool:
    return bool(stat.flags & _PF_KTHREAD)


def parse_exit_signal(stat: bytes) -> int | None:
    """The signal that ended a zombie, from ``/proc/PID/stat``'s exit code (field 52)."""
    close = stat.rfind(b")")
    fields = stat[close + 2:].split()
    if len(fields) < 50:
        return None
    code = int(fields[49])
    return code & 0x7F or None


def parse_shared_excess(smaps_rollup: bytes) -> int | None:
    """``RSS - PSS`` in bytes from ``/proc/PID/smaps_rollup``: the resident memory this
    process shares beyond its fair share; None when the file says nothing."""
    rss = pss = None
    for line in smaps_rollup.splitlines():
        if line.startswith(b"Rss:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith(b"Pss:"):
            pss = int(line.split()[1]) * 1024
    if rss is None or pss is None:
        return None
    return max(0, rss - pss)


def parse_shared_resident(smaps_rollup: bytes) -> int | None:
    """``Shared_Clean + Shared_Dirty`` in bytes from ``/proc/PID/smaps_rollup``: the
    resident memory this process shares with any other (all of it, not beyond its fair
    share); None when the file says nothing."""
    found = [int(line.split()[1]) * 1024 for line in smaps_rollup.splitlines()
             if line.startswith((b"Shared_Clean:", b"Shared_Dirty:"))]
    return sum(found) if found else None


def parse_anon_excess(smaps_rollup: bytes) -> int | None:
    """``Anonymous - Pss_Anon`` in bytes from ``/proc/PID/smaps_rollup``: the anonymous
    memory this process shares (with forked relatives, copy-on-write) beyond its fair
    share. Only this part of the excess can shrink unseen, when the pages are written; 0
    means copy-on-write cannot move the process's figure. None when the kernel does not
    say (``Pss_Anon`` is Linux 5.9's)."""
    anon = pss_anon = None
    for line in smaps_rollup.splitlines():
        if line.startswith(b"Anonymous:"):
            anon = int(line.split()[1]) * 1024
        elif line.startswith(b"Pss_Anon:"):
            pss_anon = int(line.split()[1]) * 1024
    if anon is None or pss_anon is None:
        return None
    return max(0, anon - pss_anon)


def parse_pressure_some_avg10(data: bytes) -> float | None:
    """Memory PSI ``some avg10`` (percent of the last 10 s some task stalled on memory)."""
    for line in data.splitlines():
        if line.startswith(b"some "):
            for part in line.split()[1:]:
                if part.startswith(b"avg10="):
                    return float(part[6:])
    return None


def parse_memory_cgroup(data: bytes) -> str | None:
    """The memory cgroup from ``/proc/PID/cgroup``: ``memory:PATH`` (v1 ``memory``
    controller), else ``:PATH`` (v2 unified), else None."""
    v2 = None
    for line in data.decode("utf-8", "replace").splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return f"memory:{path}"
        if controllers == "":
            v2 = f":{path}"
    return v2


def parse_oom_kill_count(data: bytes) -> int | None:
    """The ``oom_kill`` counter of v1 ``memory.oom_control`` or v2 ``memory.events``."""
    for line in data.splitlines():
        if line.startswith(b"oom_kill "):
            return int(line.split()[1])
    return None


def parse_cgroup_limit(text: bytes) -> int | None:
    """A cgroup memory limit (v1 ``limit_in_bytes`` or v2 ``memory.max``); None: unlimited.
    ValueError, saying what it found, when it is not a limit."""
    text = text.strip()
    if text == b"max":
        return None
    value = parse_cgroup_bytes(text)
    return None if value >= 1 << 60 else value  # v1's "unlimited" is a huge number


def parse_cgroup_bytes(text: bytes) -> int:
    """One byte count (v1 ``memory.usage_in_bytes``, v2 ``memory.current``); ValueError,
    saying what it found, when it is not one."""
    text = text.strip()
    if not text.isdigit():
        raise ValueError(f"not a byte count: {text[:40]!r}")
    return int(text)


def parse_memory_stat(data: bytes, key: str) -> int | None:
    """One field of ``memory.stat`` (``KEY VALUE`` lines, v1 and v2), None when absent;
    ValueError when its value is not a number."""
    name = key.encode()
    for line in data.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == name:
            return parse_cgroup_bytes(fields[1])
    return None


_NVMAP_UNIT = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _nvmap_size(token: str) -> int:
    """``123456K`` (the kernel prints KiB with a ``K``), also plain bytes, ``M``, ``G``."""
    digits, unit = (token[:-1], token[-1]) if token[-1:].isalpha() else (token, "")
    if not digits.isdigit() or unit.upper() not in _NVMAP_UNIT:
        raise ValueError(f"not a size: {token!r}")
    return int(digits) * _NVMAP_UNIT[unit.upper()]


def parse_nvmap_clients(data: bytes) -> tuple[dict[int, int], int | None, int]:
    """Jetson's nvmap clients file (debugfs ``nvmap/iovmm/clients``, nvgpu driver): GPU
    memory per PID in bytes (a process with several clients: their sum), the ``total``
    row's bytes (None: no such row), and how many rows did not parse (skipped).

    ``CLIENT PROCESS PID SIZE`` then one row per client, ``total`` last. Read from the
    right: a process name (``comm``) may hold spaces, the size and PID are the last two
    fields. ValueError when the header is missing: not this file.
    """
    lines = data.decode("utf-8", "replace").splitlines()
    header = next((i for i, line in enumerate(lines) if line.split()[:1] == ["CLIENT"]), None)
    if header is None or lines[header].split()[-2:] != ["PID", "SIZE"]:
        raise ValueError("no CLIENT PROCESS PID SIZE header")
    usage: dict[int, int] = {}
    total: int | None = None
    skipped = 0
    for line in lines[header + 1:]:
        fields = line.split()
        try:
            if fields[:1] == ["total"]:
                total = _nvmap_size(fields[-1])
            elif fields and len(fields) >= 3 and fields[-2].isdigit() and int(fields[-2]) > 0:
                pid = int(fields[-2])
                usage[pid] = usage.get(pid, 0) + _nvmap_size(fields[-1])
            elif fields:
                skipped += 1
        except ValueError:
            skipped += 1
    return usage, total, skipped


def parse_oom_score_adj(data: bytes) -> int:
    """``/proc/PID/oom_score_adj``: one integer, -1000 to 1000 (ValueError otherwise)."""
    value = int(data.strip())
    if not -1000 <= value <= 1000:
        raise ValueError(f"oom_score_adj out of range: {value}")
    return value
