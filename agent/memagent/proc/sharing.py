"""What a process shares with others, read from ``/proc/PID/{smaps_rollup,maps,stat}``.

Σ peaks subtracts from each peak the process's *shared excess* (``RSS - PSS``): the part
of its resident memory that other processes also hold, beyond its fair share (see
:mod:`memagent.alerting.headroom`). That figure goes stale when the sharing changes —
a fork, a process mapping the same file, copy-on-write pages written — while RSS does
not move. To know whose figures a change touches, each read also keeps:

* the parent PID (forked workers share their parent's pages copy-on-write), and
* the *sharing keys*: the ``(device, inode)`` of the mappings through which processes
  share pages that are not a parent's: every ``MAP_SHARED`` file mapping (``/dev/shm``
  segments, memfd, SysV shared memory, shared file maps) and private file mappings of
  at least :data:`BIG_FILE_MAPPING` bytes (model weights mapped read-only, large
  libraries). Small private file mappings — the shared libraries every process maps —
  are left out: they would tie every Python process to every other for a few MiB.
  ``maps`` is read only when the caller asks (the keys change only with new mappings).

Pure parsers here; the reads are :meth:`memagent.proc.procfs.ProcessHandle.sharing`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .parse import parse_anon_excess, parse_shared_excess, parse_shared_resident, parse_stat

#: A private file mapping at least this large is a sharing key (see the module docstring).
BIG_FILE_MAPPING: Final = 64 * 1024 * 1024

SharingKey = tuple[int, int, int]
"""``(device major, device minor, inode)`` of a mapped file."""


@dataclass(frozen=True, slots=True)
class SharingFacts:
    #: ``RSS - PSS`` in bytes; None when smaps_rollup said nothing.
    excess: int | None
    ppid: int
    #: None: ``maps`` was not read.
    keys: frozenset[SharingKey] | None
    #: Resident bytes shared with any other process (``Shared_*``); None when not said.
    shared: int | None = None
    #: The anonymous part of the excess (``Anonymous - Pss_Anon``): what copy-on-write
    #: writes can take away unseen; None when the kernel does not say.
    anon_excess: int | None = None


def parse_sharing_keys(maps: bytes) -> frozenset[SharingKey]:
    """The sharing keys of a ``/proc/PID/maps`` text (see the module docstring).

    A line: ``start-end perms offset major:minor inode [path]``. Lines that do not
    parse (a truncated last line) are skipped: the keys only choose whom to re-read.
    """
    keys: set[SharingKey] = set()
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 5:
            continue
        span, perms, _offset, device, inode_text = fields[:5]
        try:
            inode = int(inode_text)
            if inode == 0:
                continue  # anonymous: shared only with forked relatives, found by parent PID
            shared = perms[3:4] == b"s"
            if not shared:
                start, _, end = span.partition(b"-")
                if int(end, 16) - int(start, 16) < BIG_FILE_MAPPING:
                    continue
            major, _, minor = device.partition(b":")
            keys.add((int(major, 16), int(minor, 16), inode))
        except ValueError:
            continue
    return frozenset(keys)


def sharing_facts(smaps_rollup: bytes, maps: bytes | None, stat: bytes) -> SharingFacts:
    return SharingFacts(parse_shared_excess(smaps_rollup), parse_stat(stat).ppid,
                        None if maps is None else parse_sharing_keys(maps), parse_shared_resident(smaps_rollup),
                        parse_anon_excess(smaps_rollup))
