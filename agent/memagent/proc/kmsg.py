"""The kernel log (``/dev/kmsg``, readable as root): the PIDs the OOM killer killed
("Killed process PID", "oom-kill:...pid=PID"). The best of the three sources the alert
engine uses to tell an OOM kill (see :mod:`memagent.alerting.engine`). The "Killed process"
line also says what the kernel judged the victim by: its RSS and its ``oom_score_adj``
(:class:`Victim`), which the alert compares with the processes the kill spared.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)

_KILLED = re.compile(rb"(?:Killed process|oom-kill:.*?,pid=|Memory cgroup out of memory: Killed process) ?(\d+)")
_VICTIM = re.compile(rb"Killed process (\d+) .*?anon-rss:(\d+)kB, file-rss:(\d+)kB, shmem-rss:(\d+)kB"
                     rb".*? oom_score_adj:(-?\d+)")


@dataclass(frozen=True)
class Victim:
    """What the kernel's "Killed process" line says of its victim."""

    pid: int
    #: anon + file + shmem RSS at the kill, bytes.
    rss_bytes: int
    oom_score_adj: int


def parse_victim(record: bytes) -> Victim | None:
    """The victim of a "Killed process" record (kernel 4.19 on: RSS by kind and
    ``oom_score_adj``); None for any other record, or an older kernel's line."""
    m = _VICTIM.search(record)
    if m is None:
        return None
    pid, anon, file, shmem, adj = (int(g) for g in m.groups())
    return Victim(pid, (anon + file + shmem) * 1024, adj)


class KernelLog:
    """Non-blocking reader of /dev/kmsg from the moment it opened; silent when not root."""

    def __init__(self, path: str = "/dev/kmsg") -> None:
        self.available = False
        self._fd = -1
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.lseek(self._fd, 0, os.SEEK_END)
            self.available = True
        except OSError as exc:
            log.info("kernel log not readable (%s): OOM kills are found from cgroups or inferred", exc.strerror)
        self.killed: dict[int, float] = {}
        #: What the kernel's line said of each of them (kept as long as ``killed``).
        self.victims: dict[int, Victim] = {}

    def poll(self, now: float) -> None:
        """Read new records; remember the PIDs the OOM killer killed (for a minute)."""
        if not self.available:
            return
        while True:
            try:
                record = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten records: skip ahead
                    continue
                break
            if not record:
                break
            m = _KILLED.search(record)
            if m:
                self.killed[int(m.group(1))] = now
            victim = parse_victim(record)
            if victim is not None:
                self.victims[victim.pid] = victim
        for pid in [p for p, t in self.killed.items() if now - t > 60]:
            del self.killed[pid]
            self.victims.pop(pid, None)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

