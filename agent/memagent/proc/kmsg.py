"""The kernel log (``/dev/kmsg``, readable as root): the PIDs the OOM killer killed
("Killed process PID", "oom-kill:...pid=PID"). The best of the three sources the alert
engine uses to tell an OOM kill (see :mod:`memagent.alerting.engine`).
"""

from __future__ import annotations

import errno
import logging
import os
import re

log = logging.getLogger(__name__)

_KILLED = re.compile(rb"(?:Killed process|oom-kill:.*?,pid=|Memory cgroup out of memory: Killed process) ?(\d+)")


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

