"""The few named errors the agent's /proc layer raises, psutil style.

OS errors are translated at the boundary (:mod:`memagent.procfs`) into these, each
carrying the PID, so callers never inspect errno.
"""

from __future__ import annotations


class MemagentError(Exception):
    """Base of the agent's errors."""


class NoSuchProcess(MemagentError):
    """The process does not exist, or no longer is the one we meant (PID reused)."""

    code = "no_such_process"

    def __init__(self, pid: int, reason: str = "") -> None:
        self.pid = pid
        super().__init__(f"no such process: {pid}" + (f" ({reason})" if reason else ""))


class AccessDenied(MemagentError):
    """The caller, or the agent itself, may not read or watch this process."""

    code = "permission_denied"

    def __init__(self, pid: int, reason: str = "") -> None:
        self.pid = pid
        super().__init__(f"permission denied: {pid}" + (f" ({reason})" if reason else ""))


class NotUserProcess(MemagentError):
    """A kernel thread: it has no memory of its own to watch."""

    code = "invalid"

    def __init__(self, pid: int) -> None:
        self.pid = pid
        super().__init__(f"not a user-space process: {pid}")
