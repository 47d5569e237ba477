"""The processes of ``memagent run``: CMD forked and held before its ``exec``
(:class:`Child`), its orphans reaped (:meth:`Child.reap_orphans`, :func:`become_subreaper`), and
the agent that watches them, in a thread of its own on a private socket
(:class:`RunAgent`: :class:`memagent.embedded.EmbeddedAgent`'s pattern, which the layers
keep out of ``cli``'s reach, without auto-attach patterns)."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import signal
import tempfile
import threading

from ..agent import Agent
from ..config import AgentConfig

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """CMD's orphans come to us, not to init (best effort: without ``prctl`` they go)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Child:
    """CMD, forked now and held before its ``exec`` until :meth:`release`."""

    def __init__(self, argv: list[str], mask: set[int]) -> None:
        go_r, go_w = os.pipe()
        err_r, err_w = os.pipe()  # close-on-exec: EOF tells the exec succeeded
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child: restore the mask, wait, exec
            code = 127
            try:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                os.close(go_w)
                os.close(err_r)
                if os.read(go_r, 1):
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
        self.wait_status: int | None = None
        self.released = False

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

    def reap(self, block: bool = False) -> bool:
        if self.wait_status is None:
            pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
            if pid:
                self.wait_status = status
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
            os.waitpid(info.si_pid, 0)

    @property
    def exit_code(self) -> int:
        """Its exit status, ``128 + n`` when signal ``n`` killed it."""
        assert self.wait_status is not None
        code = os.waitstatus_to_exitcode(self.wait_status)
        return 128 - code if code < 0 else code


class RunAgent:
    """An :class:`Agent` in a daemon thread on a private socket (a 0700 temporary
    directory), no state directory, attaching only what it is told."""

    def __init__(self, interval: float) -> None:
        self._dir = tempfile.mkdtemp(prefix="memagent-run-")
        self.socket = os.path.join(self._dir, "memagent.sock")
        self.agent = Agent(AgentConfig(socket=self.socket, interval=interval))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="memagent-run-agent", daemon=True)

    def start(self, timeout: float = 10.0) -> None:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the embedded agent did not start")
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        ready = asyncio.Event()
        serving = asyncio.ensure_future(self.agent.run(self._stop, ready))
        await ready.wait()
        self._ready.set()
        await serving

    def attach_before_exec(self, pid: int, label: str, timeout: float = 10.0) -> None:
        """Watch ``pid`` and its descendants, a child held before its ``exec``: as a
        followed parent's child attached at its fork, its figures start afresh at that
        ``exec`` (its parent's image is not its memory). MemagentError if it cannot be."""
        assert self._loop is not None

        async def attach() -> None:
            self.agent.registry.attach(pid, label=label, children=True)[0].pre_exec = True

        asyncio.run_coroutine_threadsafe(attach(), self._loop).result(timeout)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
        shutil.rmtree(self._dir, ignore_errors=True)
