"""The processes of ``memagent run``: CMD forked and held before its ``exec``
(:class:`Child`), its orphans reaped (:meth:`Child.reap_orphans`, :func:`become_subreaper`), and
the agent that watches them, in a thread of its own on a private socket
(:class:`RunAgent`: a :class:`memagent.agent_thread.AgentThread`, as memtop's embedded
agent is, without auto-attach patterns)."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
from collections.abc import Iterable

from ..agent_thread import AgentThread
from ..config import AgentConfig, HeadroomConfig
from ..proc.children import die_with
from .marks import GATE_COMM, UNDER_RUN

MiB = 1 << 20
#: The run's tree is small and short-lived, and its verdict is a gate: its sharing is read
#: far more often than the daemon's (a 200 MiB process's ``smaps_rollup`` costs ~0.7 ms).
RUN_HEADROOM = HeadroomConfig(pss_refresh=1.0, pss_drift=8 * MiB)

PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, arg: int | bytes) -> bool:
    """libc's ``prctl(option, arg)``; whether it succeeded (False without ``prctl``)."""
    try:
        import ctypes

        return int(ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> None:
    """CMD's orphans come to us, not to init (best effort: without ``prctl`` they go)."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def mark_as_gate() -> bool:
    """Name this thread (the main one: the process's ``comm``) :data:`~.marks.GATE_COMM`,
    which every descendant can read in ``/proc/PID/stat`` whatever its environment
    (:mod:`.marks`: the pytest plugin then leaves its high-water mark to us). Called in
    the thread that forks CMD, before it does; whether the kernel took the name."""
    return _prctl(PR_SET_NAME, GATE_COMM.encode())


class Child:
    """CMD, forked now and held before its ``exec`` until :meth:`release`."""

    def __init__(self, argv: list[str], mask: set[int]) -> None:
        go_r, go_w = os.pipe()
        err_r, err_w = os.pipe()  # close-on-exec: EOF tells the exec succeeded
        # CMD dies with us, even when we are SIGKILLed (a CI runner's timeout): a gate's
        # command must not run on unwatched. PR_SET_PDEATHSIG fires when the thread that
        # forked ends: this one, the main thread, which lives as long as the run.
        tie_to_us = die_with(os.getpid())
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child: restore the mask, wait, exec
            code = 127
            try:
                if tie_to_us is not None:
                    tie_to_us()
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                os.close(go_w)
                os.close(err_r)
                if os.read(go_r, 1):
                    # memagent's pytest plugin then leaves the high-water mark alone (ours to
                    # judge); where an `env -i` strips it, our thread name says it (marks.py).
                    os.environ[UNDER_RUN] = str(os.getppid())
                    try:
                        os.execvp(argv[0], argv)
                    except OSError as exc:
                        code = 127 if exc.errno in (errno.ENOENT, errno.ENOTDIR) else 126
                        os.write(err_w, f"{exc.errno}".encode())
            finally:
                os._exit(code)
        os.close(go_r)
        os.close(err_w)
        self.pid, self._go, self._err = pid, go_w, err_r
        self.argv = argv
        #: Readable once CMD has exited: the supervisor waits on it beside the agent's
        #: socket, so that it wakes at the exit, not at the next frame. None where the
        #: kernel has no ``pidfd_open`` (then it looks every :data:`~.run.WAKE`).
        self.exit_fd = _pidfd(pid)
        self.wait_status: int | None = None
        self.released = False
        #: The kernel's own peak of the biggest process of the tree reaped so far (bytes):
        #: ``wait4``'s ``ru_maxrss`` of CMD counts CMD and every descendant it (or its
        #: descendants) reaped, and of each orphan we reaped; exact, even for a process the
        #: agent never saw (no kernel process events: not root).
        self.kernel_max_rss = 0
        #: CMD's figure starts at our RSS when it was forked (the image its ``exec``
        #: replaced): below this, it says nothing about CMD's tree.
        self.kernel_floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def release(self) -> str | None:
        """Let it exec; why it could not (``strerror``), or None once it did."""
        self.released = True
        os.write(self._go, b"x")
        os.close(self._go)
        data = os.read(self._err, 64)
        os.close(self._err)
        return os.strerror(int(data)) if data else None

    def abandon(self) -> None:
        """It exits without exec (EOF on its pipe); reaped."""
        self.released = True
        os.close(self._go)
        os.close(self._err)
        self.reap(block=True)

    def exited(self) -> bool:
        """Whether it has exited: reaped, or a zombie still to reap (whose ``/proc`` entry
        still answers the agent)."""
        if self.wait_status is not None:
            return True
        return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

    def reap(self, block: bool = False) -> bool:
        if self.wait_status is None:
            pid, status, usage = os.wait4(self.pid, 0 if block else os.WNOHANG)
            if pid:
                self.wait_status = status
                self.kernel_max_rss = max(self.kernel_max_rss, usage.ru_maxrss * 1024)
                if self.exit_fd is not None:
                    os.close(self.exit_fd)
                    self.exit_fd = None
        return self.wait_status is not None

    def reap_orphans(self, tree: set[int]) -> None:
        """Reap exited processes of CMD's tree reparented to us; never the agent's own
        children (py-spy), which its event loop waits for, nor CMD (:meth:`reap`)."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == self.pid or info.si_pid not in tree:
                return
            _, _, usage = os.wait4(info.si_pid, 0)
            self.kernel_max_rss = max(self.kernel_max_rss, usage.ru_maxrss * 1024)

    @property
    def exit_code(self) -> int:
        """Its exit status, ``128 + n`` when signal ``n`` killed it."""
        assert self.wait_status is not None
        code = os.waitstatus_to_exitcode(self.wait_status)
        return 128 - code if code < 0 else code

    @property
    def kernel_peak(self) -> int | None:
        """The tree's biggest reaped process's peak by the kernel, when it tells something."""
        return self.kernel_max_rss if self.kernel_max_rss > self.kernel_floor else None


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` (our child) exits, or None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd_open (Python or kernel): poll
        return None


class Sentinel:
    """A process of ours that outlives a SIGKILLed ``memagent run`` to kill what was left of
    CMD's tree. ``PR_SET_PDEATHSIG`` ties only CMD to the run; CMD's descendants would be
    reparented to init and run on. The sentinel is told each process of the tree the agent
    sees, as (PID, start time), over a pipe (:meth:`tell`); when the pipe closes without
    :meth:`done` (the run died, however), it SIGKILLs each of them still alive with that same
    start time (a PID the kernel gave to another process since is left alone), then exits.
    Forked before the agent's thread starts (a fork of a threaded process may deadlock),
    after the run's signals are blocked: Ctrl-C and a forwarded SIGTERM do not reach it."""

    def __init__(self) -> None:
        read_end, self._pipe = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the sentinel
            try:
                os.closerange(0, read_end)  # the run's stdout and stderr too: a reader waits for no EOF
                os.closerange(read_end + 1, os.sysconf("SC_OPEN_MAX"))
                _guard(read_end)
            finally:
                os._exit(0)
        os.close(read_end)
        self.pid = pid
        self._told: set[tuple[int, float]] = set()

    def tell(self, processes: Iterable[tuple[int, float]]) -> None:
        """The processes of the tree seen so far (those already told are not sent again)."""
        new = [key for key in processes if key not in self._told]
        if not new or self._pipe < 0:
            return
        self._told.update(new)
        try:
            os.write(self._pipe, "".join(f"{pid} {start!r}\n" for pid, start in new).encode())
        except OSError:  # the sentinel is gone (killed): nothing to tell
            self._close()

    def done(self) -> None:
        """The run ends as it should: the sentinel exits without killing; reaped."""
        if self._pipe >= 0:
            with contextlib.suppress(OSError):
                os.write(self._pipe, b"done\n")
            self._close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)

    def _close(self) -> None:
        os.close(self._pipe)
        self._pipe = -1


def _guard(pipe: int) -> None:  # pragma: no cover - runs in the sentinel
    """Read what the run tells until it closes the pipe; unless it said ``done``, kill."""
    from ..errors import MemagentError
    from ..proc.procfs import ProcFS

    data = b""
    while chunk := os.read(pipe, 65536):
        data += chunk
    lines = data.decode().splitlines()
    if lines[-1:] == ["done"]:
        return
    procfs = ProcFS()
    for line in lines:
        pid, start = int(line.split()[0]), float(line.split()[1])
        try:
            if abs(procfs.start_time(pid, procfs.stat(pid).starttime) - start) < 0.01:
                os.kill(pid, signal.SIGKILL)
        except (MemagentError, OSError):  # gone already
            continue


class RunAgent(AgentThread):
    """An agent in a daemon thread on a private socket (a 0700 temporary directory), no
    state directory, attaching only what it is told."""

    def __init__(self, interval: float) -> None:
        super().__init__(lambda socket: AgentConfig(socket=socket, interval=interval, headroom=RUN_HEADROOM),
                         prefix="memagent-run-", name="memagent-run-agent")

    def attach_before_exec(self, pid: int, label: str | None = None) -> None:
        """Watch ``pid`` and its descendants, a child held before its ``exec``: as a
        followed parent's child attached at its fork, its figures start afresh at that
        ``exec`` (its parent's image is not its memory). MemagentError if it cannot be."""

        async def attach() -> None:
            self.agent.registry.attach(pid, label=label, children=True)[0].pre_exec = True

        self.call(attach)

    def take_events(self) -> None:
        """Have the agent take the kernel's process events queued so far, and wait until it
        has: called once CMD has exited and before it is reaped, so that its ``exec`` (queued
        before its exit) is applied to it, not passed over as a reaped process's (a command
        that lives a millisecond would keep the figures and name of our own image)."""

        async def drain() -> None:
            self.agent.process_events.drain()

        self.call(drain)

    def tick_now(self) -> None:
        """Have the agent tick at once, not at its next deadline (CMD has exited: the tick
        that tells it, and the figures after it, would otherwise be up to an interval away)."""
        self.call_soon(self.agent.ticker.hurry)
