"""A writable copy of the fixture /proc tree (``fixtures/proc``) for the unit tests of the
parts above /proc: the sampler, auto-attach, the alert engine, request dispatch.

A real :class:`~memagent.proc.procfs.ProcFS` reads the copy and real handles hold its files
open (``pread`` works on them as on /proc). A test changes a process by rewriting its files
in place, same inode, so the descriptors the handles hold see the change, as on /proc.

The fixture processes: 4242 ``python3`` (uid 1000, parent 4100), 4243 ``worker`` (a zombie,
child of 4242, uid 1000) and 4244 ``(weird) name)`` (child of 4242, uid 1001).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from memagent.proc.procfs import PAGE_SIZE, ProcFS

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "proc"
KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TRAINER, ZOMBIE, WEIRD = 4242, 4243, 4244

#: The fixture tree's files (path relative to it -> content), read once.
_FIXTURE_FILES = {p.relative_to(FIXTURE): p.read_bytes() for p in sorted(FIXTURE.rglob("*")) if p.is_file()}

# Fields of /proc/PID/stat after ``(comm)``, counted from 0 (proc(5) numbers them from 3).
_STATE, _PPID, _STARTTIME, _EXIT_CODE = 0, 1, 19, 49


#: A process that maps only small private files (a library): no sharing key.
LIBRARY_MAPS = ("7f2a10000000-7f2a10200000 r-xp 00000000 08:01 1234567                    "
                "/usr/lib/x86_64-linux-gnu/libc.so.6\n")


class ProcTree:
    """The copy, at ``root``; sizes are in bytes, as the agent keeps them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for rel, data in _FIXTURE_FILES.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        for pid in (TRAINER, ZOMBIE, WEIRD):
            self.write(pid, "clear_refs", b"")  # reset-peaks writes "5" to it
            # As on /proc, a (dumpable) process's files belong to its owner.
            uid = int(re.search(r"^Uid:\s*(\d+)", self.read(pid, "status"), re.M).group(1))  # type: ignore[union-attr]
            for path in (root / str(pid), *(root / str(pid)).iterdir()):
                os.chown(path, uid, -1)

    def procfs(self) -> ProcFS:
        return ProcFS(root=str(self.root))

    def path(self, pid: int, name: str) -> Path:
        return self.root / str(pid) / name

    def write(self, pid: int, name: str, data: bytes | str) -> None:
        """Rewrite a file in place (same inode: open descriptors read the new content)."""
        self.path(pid, name).write_bytes(data.encode() if isinstance(data, str) else data)

    def read(self, pid: int, name: str) -> str:
        return self.path(pid, name).read_text()

    # ------------------------------------------------------------------ memory

    def status_kb(self, pid: int, key: str) -> int | None:
        m = re.search(rf"^{key}:\s*(\d+) kB$", self.read(pid, "status"), re.M)
        return int(m.group(1)) * KiB if m else None

    def set_status(self, pid: int, **sizes: int) -> None:
        """Replace ``VmHWM``, ``VmRSS``, ``VmSwap``... lines (bytes) in the status file."""
        self.write(pid, "status", _with_sizes(self.read(pid, "status"), sizes))

    def set_memory(self, pid: int, rss: int, *, shared: int = 0, hwm: int | None = None) -> None:
        """A new resident size: statm, and status's VmRSS and VmHWM (by default the kernel's
        rule: the high-water mark never falls below RSS)."""
        self.write(pid, "statm", _statm(rss, shared))
        old_hwm = self.status_kb(pid, "VmHWM") or 0
        self.set_status(pid, VmRSS=rss, VmHWM=hwm if hwm is not None else max(old_hwm, rss))

    def set_smaps_rollup(self, pid: int, rss: int, pss: int, maps: str = LIBRARY_MAPS, shared: int = 0,
                         anon_excess: int | None = None) -> None:
        """What a PSS read finds: smaps_rollup's ``Rss``/``Pss``, ``Shared_Dirty`` (pages it
        shares with anyone), and ``maps`` (whose shared mappings tie it to other processes,
        see memagent.proc.sharing); with ``anon_excess``, ``Anonymous`` and ``Pss_Anon``
        that far apart (the pages it shares copy-on-write; else no ``Anonymous`` line, as
        before Linux 5.9)."""
        anon = "" if anon_excess is None else f"Anonymous:      {(pss + anon_excess) // KiB:8d} kB\n"
        self.write(pid, "smaps_rollup",
                   "55a4c0e2b000-7ffd1b5f9000 ---p 00000000 00:00 0                          [rollup]\n"
                   f"Rss:            {rss // KiB:8d} kB\nPss:            {pss // KiB:8d} kB\n"
                   f"Pss_Anon:       {(0 if anon_excess is None else pss) // KiB:8d} kB\nShared_Clean:          0 kB\n"
                   f"Shared_Dirty:   {shared // KiB:8d} kB\n{anon}")
        self.write(pid, "maps", maps)

    def set_meminfo(self, total: int, available: int) -> None:
        text = (self.root / "meminfo").read_text()
        text = re.sub(r"^MemTotal:.*$", f"MemTotal:       {total // KiB} kB", text, flags=re.M)
        text = re.sub(r"^MemAvailable:.*$", f"MemAvailable:   {available // KiB} kB", text, flags=re.M)
        (self.root / "meminfo").write_text(text)

    def set_pressure(self, some_avg10: float) -> None:
        (self.root / "pressure").mkdir(exist_ok=True)
        (self.root / "pressure" / "memory").write_text(
            f"some avg10={some_avg10:.2f} avg60=0.00 avg300=0.00 total=1\n"
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")

    # ------------------------------------------------------------------ processes

    def _edit_stat(self, pid: int, comm: str | None = None, **fields: int | str) -> None:
        self.write(pid, "stat", _stat_with(self.read(pid, "stat"), pid, comm, **fields))

    def add_process(self, pid: int, comm: str, *, ppid: int = 1, uid: int = 1000, rss: int | None = None,
                    hwm: int | None = None, like: int = TRAINER) -> None:
        """A new process: ``like``'s files with its own PID, name, parent, owner and, when
        given, resident size and high-water mark (by default ``rss``)."""
        status = self.read(like, "status")
        for key, value in (("Name", comm), ("Pid", pid), ("Tgid", pid), ("PPid", ppid),
                           ("Uid", f"{uid}\t{uid}\t{uid}\t{uid}")):
            status = re.sub(rf"^{key}:.*$", f"{key}:\t{value}", status, flags=re.M)
        statm = self.read(like, "statm")
        if rss is not None:
            statm = _statm(rss, 0)
            status = _with_sizes(status, {"VmRSS": rss, "VmHWM": hwm if hwm is not None else rss})
        (self.root / str(pid)).mkdir()
        self.write(pid, "stat", _stat_with(self.read(like, "stat"), pid, comm, ppid=ppid, starttime=pid * 10,
                                           state="S"))
        self.write(pid, "statm", statm)
        self.write(pid, "status", status)
        self.write(pid, "cmdline", f"{comm}\0")
        self.write(pid, "clear_refs", b"")

    def exec(self, pid: int, comm: str) -> None:
        """The process executes another program: a new name."""
        self._edit_stat(pid, comm)
        self.write(pid, "status", re.sub(r"^Name:.*$", f"Name:\t{comm}", self.read(pid, "status"), flags=re.M))

    def exit(self, pid: int, signal: int = 0) -> None:
        """The process ends (killed by ``signal``, 0: it exited) and is now a zombie."""
        self._edit_stat(pid, state="Z", exit_code=signal)
        self.write(pid, "statm", "0 0 0 0 0 0 0\n")

    def link_exe(self, pid: int, target: str) -> None:
        self.path(pid, "exe").symlink_to(target)


def _statm(rss: int, shared: int) -> str:
    size = rss // PAGE_SIZE * 4 + 1  # never 0: that is a zombie's
    return f"{size} {rss // PAGE_SIZE} {shared // PAGE_SIZE} 1 0 {size // 2} 0\n"


def _with_sizes(status: str, sizes: dict[str, int]) -> str:
    for key, size in sizes.items():
        status, n = re.subn(rf"^{key}:.*$", f"{key}:\t{size // KiB:8d} kB", status, flags=re.M)
        assert n == 1, f"no {key} line in the status file"
    return status


def _stat_with(data: str, pid: int, comm: str | None = None, **fields: int | str) -> str:
    """``data`` (a stat file) for ``pid``, with another comm and other fields."""
    open_, close = data.index("("), data.rindex(")")
    rest = data[close + 2:].split()
    for name, value in fields.items():
        rest[{"state": _STATE, "ppid": _PPID, "starttime": _STARTTIME, "exit_code": _EXIT_CODE}[name]] = str(value)
    return f"{pid} ({data[open_ + 1:close] if comm is None else comm}) {' '.join(rest)}\n"
