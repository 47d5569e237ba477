"""The one entry point memtop uses to run an agent in-process when no daemon is there.

The embedded agent is the same :class:`~memagent.agent.Agent` as the daemon's, on a
private socket (a 0700 temporary directory), in a background thread with its own event
loop. memtop then talks to it over the socket like to any daemon, so there is one code
path. It watches the current user's Python processes (everyone's when root); with
``demo=True`` it also starts the demo fleet and attaches it, labelled.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import threading

from .agent import Agent
from .config import AgentConfig
from .demo_fleet import Fleet, attach_fleet

log = logging.getLogger(__name__)

DEFAULT_PATTERNS = ("python*",)


class EmbeddedAgent:
    """An agent running in a daemon thread; :meth:`stop` ends it and removes its socket."""

    def __init__(self, *, interval: float = 0.5, patterns: tuple[str, ...] = DEFAULT_PATTERNS,
                 demo: bool = False) -> None:
        self._dir = tempfile.mkdtemp(prefix="memtop-")
        self.socket = os.path.join(self._dir, "memagent.sock")
        self.agent = Agent(AgentConfig(socket=self.socket, interval=interval, auto=list(patterns)))
        if os.geteuid() != 0:
            uid = os.getuid()
            self.agent.scanner.may_watch = lambda owner: owner == uid
        self.demo = demo
        self._fleet: Fleet | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="memagent-embedded", daemon=True)

    def start(self, timeout: float = 10.0) -> str:
        """Start and wait until the socket listens; returns its path."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the embedded agent did not start")
        if self._error is not None:
            raise self._error
        return self.socket

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
        if self.demo:
            await self._start_demo()
        self._ready.set()
        await serving

    async def _start_demo(self) -> None:
        fleet = Fleet()
        self._fleet = fleet
        fleet.start()
        for problem in await attach_fleet(fleet, self.agent.registry):
            log.info("demo: %s", problem)

    @property
    def running(self) -> bool:
        """Whether the agent's thread still serves (False once :meth:`stop` returned)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        # The fleet first: its members die with the agent's thread too (PR_SET_PDEATHSIG
        # follows the thread that started them), and one SIGTERM each is enough.
        if self._fleet is not None:
            self._fleet.stop()
            self._fleet = None
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
        shutil.rmtree(self._dir, ignore_errors=True)


def start_embedded(*, interval: float = 0.5, demo: bool = False) -> EmbeddedAgent:
    """Start an embedded agent; the caller must call :meth:`EmbeddedAgent.stop`."""
    agent = EmbeddedAgent(interval=interval, demo=demo)
    agent.start()
    return agent
