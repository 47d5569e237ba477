"""Every error the agent raises, under one root, psutil style.

OS errors and unparsable /proc contents are translated at the kernel boundary
(:mod:`memagent.proc`) into :class:`ProcessError` subclasses carrying the PID, so no
caller inspects errno or catches ``ValueError`` from a parser: upstream code catches
:class:`MemagentError` (or one of its branches) and nothing else. Each error that a
client can receive carries its wire ``code`` (:class:`memproto.vocabulary.ErrorCode`).

Wire errors (a malformed frame) are :class:`memproto.ProtocolError`: the protocol package
imports nothing of ours, so they have a root of their own there.
"""

from __future__ import annotations

from memproto.vocabulary import ErrorCode


class MemagentError(Exception):
    """Root of the agent's errors."""

    code: str = ErrorCode.ERROR


# --------------------------------------------------------------------------- processes


class ProcessError(MemagentError):
    """Something about one process; ``pid`` says which."""

    def __init__(self, pid: int, message: str) -> None:
        self.pid = pid
        super().__init__(message)


class NoSuchProcess(ProcessError):
    """The process does not exist, or no longer is the one we meant (PID reused)."""

    code = ErrorCode.NO_SUCH_PROCESS

    def __init__(self, pid: int, reason: str = "") -> None:
        super().__init__(pid, f"no such process: {pid}" + (f" ({reason})" if reason else ""))


class AccessDenied(ProcessError):
    """The caller, or the agent itself, may not read or watch this process."""

    code = ErrorCode.PERMISSION_DENIED

    def __init__(self, pid: int, reason: str = "") -> None:
        super().__init__(pid, f"permission denied: {pid}" + (f" ({reason})" if reason else ""))


class NotUserProcess(ProcessError):
    """A kernel thread: it has no memory of its own to watch."""

    code = ErrorCode.INVALID

    def __init__(self, pid: int) -> None:
        super().__init__(pid, f"not a user-space process: {pid}")


class CannotRead(ProcessError):
    """A /proc file of the process could not be read for another reason (the agent is out
    of descriptors, say) or did not parse: what it said is unknown, not zero."""

    code = ErrorCode.ERROR

    def __init__(self, pid: int, reason: str) -> None:
        super().__init__(pid, f"cannot watch {pid}: {reason}")


# --------------------------------------------------------------------------- configuration


class ConfigError(MemagentError):
    """An invalid configuration: ``key`` is the dotted key, ``reason`` what is wrong."""

    code = ErrorCode.INVALID

    def __init__(self, key: str, reason: str, path: str | None = None) -> None:
        self.key = key
        self.reason = reason
        self.path = path
        super().__init__(f"{path + ': ' if path else ''}{key}: {reason}")

    def at(self, path: str | None) -> ConfigError:
        """The same error, naming the file it came from."""
        return ConfigError(self.key, self.reason, path)


# --------------------------------------------------------------------------- serving


class SocketPathError(MemagentError):
    """The socket path cannot be used (it exists and is not a socket, ...)."""


class MetricsListenError(MemagentError):
    """The metrics endpoint cannot listen (``[metrics] listen``: the port is taken, the
    address is not this machine's, a port below 1024 without the right): one line, and
    the daemon does not start (docs/metrics.md)."""


class DaemonAlreadyRunning(SocketPathError):
    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"a memagent daemon is already listening on {path}")


# --------------------------------------------------------------------------- the daemon's files


class RecordDirRefused(MemagentError):
    """The flight recorder's directory is not one to write to (the message says why, one
    line); the daemon runs on without recording (docs/recording.md)."""


# --------------------------------------------------------------------------- commands

#: The ``--json`` error code of an output file that cannot be written (``record``,
#: ``plot``, ``run --report``): the client's own, with hyphens (docs/cli.md).
CANNOT_WRITE = "cannot-write"
#: ``history``, ``report``, ``plot``: no recording to read, or not a recording (exit 1).
NO_RECORDING = "no-recording"


class CommandFailed(MemagentError):
    """A command that cannot do its work (an output that cannot be written, a recording
    that cannot go on): one line for stderr, ``code`` for ``--json``, an exit ``status``.
    The rooms (:mod:`memagent.recordings`, :mod:`memagent.gate`) raise it, so it lives
    here rather than with the command line; :func:`memagent.cli.exits.finish` reports it."""

    def __init__(self, code: str, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.code, self.status = code, status


class RecordingUnavailable(MemagentError):
    """No recording to read (``history``, ``report``, ``plot``): the message says where it
    looked and what to do. Here, not in :mod:`memagent.recordings.source` which raises it,
    so that ``main`` can report it without importing the recording reader for every command."""
