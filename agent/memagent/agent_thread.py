"""An :class:`~memagent.agent.Agent` in a background thread with its own event loop, on a
private socket (a 0700 temporary directory): what memtop's embedded agent
(:mod:`memagent.embedded`) and ``memagent run`` (:mod:`memagent.gate.run_agent`) both
start, then talk to over that socket like to any daemon."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from .agent import Agent
from .config import AgentConfig
from .errors import MemagentError

#: How often a wait for the agent's thread checks that it still lives, in seconds.
_ALIVE_CHECK = 0.25


class AgentStopped(MemagentError):
    """The agent's thread ended before it did what was waited for (its error, if any, is
    raised instead)."""


class AgentThread:
    """``config_for(socket)`` builds the agent's configuration once the socket's path is
    known; :meth:`stop` ends the agent and removes its directory."""

    def __init__(self, config_for: Callable[[str], AgentConfig], *, prefix: str, name: str) -> None:
        self._dir = tempfile.mkdtemp(prefix=prefix)
        self.socket = os.path.join(self._dir, "memagent.sock")
        self.agent = Agent(config_for(self.socket))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> str:
        """Start and wait until the socket listens (and :meth:`on_ready` ran); returns its path.

        Readiness is the agent's own event, awaited for as long as its thread lives: no
        deadline, which a loaded box would exceed (a gate failing before its command ran,
        issue 26). An agent that stops before it listens raises its error here."""
        self._thread.start()
        while not self._ready.wait(_ALIVE_CHECK):
            if not self._thread.is_alive():
                break
        if self._error is not None:
            raise self._error
        if not self._ready.is_set():
            raise AgentStopped("the embedded agent stopped before it listened")
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
        await self.on_ready()
        self._ready.set()
        await serving

    async def on_ready(self) -> None:
        """Runs on the agent's loop once it listens, before :meth:`start` returns."""

    def call(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``work()`` on the agent's loop (where its parts may be touched) and wait for
        it as long as the agent's thread lives (no deadline: see :meth:`start`)."""
        assert self._loop is not None, "not started"
        done = asyncio.run_coroutine_threadsafe(work(), self._loop)
        while True:
            try:
                return done.result(_ALIVE_CHECK)
            except concurrent.futures.CancelledError:  # the loop ended with the work unfinished
                raise AgentStopped("the embedded agent stopped") from None
            except concurrent.futures.TimeoutError:
                if not self._thread.is_alive():
                    raise AgentStopped("the embedded agent stopped") from None

    def call_soon(self, work: Callable[[], None]) -> None:
        """Run ``work()`` on the agent's loop without waiting for it (it does nothing once
        the loop has ended)."""
        assert self._loop is not None, "not started"
        with contextlib.suppress(RuntimeError):  # the loop closed: nothing to do there
            self._loop.call_soon_threadsafe(work)

    @property
    def running(self) -> bool:
        """Whether the agent's thread still serves (False once :meth:`stop` returned)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
        shutil.rmtree(self._dir, ignore_errors=True)
