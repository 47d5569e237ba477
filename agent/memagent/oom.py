"""Was a watched process killed by the OOM killer? Three sources, best first:

1. the kernel log (``/dev/kmsg``, readable as root): "Killed process PID" / "oom-kill:...pid=PID";
2. the ``oom_kill`` counter of the process's memory cgroup (v1 ``memory.oom_control``,
   v2 ``memory.events``) went up while it died;
3. inferred: it died of SIGKILL (its exit code, read while it was a zombie) with memory
   high, marked ``inferred``.
"""

from __future__ import annotations

import errno
import logging
import os
import re

from .headroom import cgroup_file

log = logging.getLogger(__name__)

_KILLED = re.compile(rb"(?:Killed process|oom-kill:.*?,pid=|Memory cgroup out of memory: Killed process) ?(\d+)")
SIGKILL = 9


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
        for pid in [p for p, t in self.killed.items() if now - t > 60]:
            del self.killed[pid]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def oom_kill_count(cgroup: str | None, root: str = "/sys/fs/cgroup") -> int | None:
    """The cgroup's ``oom_kill`` counter, or None when there is none to read."""
    if not cgroup:
        return None
    try:
        with open(cgroup_file(cgroup, "memory.oom_control", "memory.events", root)) as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def exit_signal(stat: bytes) -> int | None:
    """The signal that ended a zombie, from ``/proc/PID/stat``'s exit code (field 52)."""
    close = stat.rfind(b")")
    fields = stat[close + 2:].split()
    if len(fields) < 50:
        return None
    code = int(fields[49])
    return code & 0x7F or None
