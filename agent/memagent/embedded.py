"""The one entry point memtop uses to run an agent in-process when no daemon is there.

The embedded agent is the same :class:`~memagent.agent.Agent` as the daemon's, on a
private socket (a 0700 temporary directory), in a background thread with its own event
loop. memtop then talks to it over the socket like to any daemon, so there is one code
path. It watches the current user's Python processes (everyone's when root); with
``demo=True`` it starts the demo fleet instead and watches it alone, labelled, against the
demo's own capacity (:data:`~memagent.demo_fleet.DEMO_CAPACITY`).
"""

from __future__ import annotations

import logging
import os

from .agent_thread import AgentThread
from .config import AgentConfig
from .demo_fleet import Fleet, attach_fleet, demo_config

log = logging.getLogger(__name__)

DEFAULT_PATTERNS = ("python*",)


class EmbeddedAgent(AgentThread):
    """An agent running in a daemon thread; :meth:`stop` ends it and removes its socket."""

    def __init__(self, *, interval: float = 0.5, patterns: tuple[str, ...] = DEFAULT_PATTERNS,
                 demo: bool = False) -> None:
        # The demo watches its own fleet only, against its own capacity (DEMO_CAPACITY):
        # within a minute it shows a warning, then a critical alert, whatever the box.
        def config(socket: str) -> AgentConfig:
            if demo:
                return demo_config(socket, interval)
            return AgentConfig(socket=socket, interval=interval, auto=list(patterns))

        super().__init__(config, prefix="memtop-", name="memagent-embedded")
        if os.geteuid() != 0:
            uid = os.getuid()
            self.agent.scanner.may_watch = lambda owner: owner == uid
        self.demo = demo
        self._fleet: Fleet | None = None

    async def on_ready(self) -> None:
        if self.demo:
            fleet = Fleet()
            self._fleet = fleet
            fleet.start()
            for problem in await attach_fleet(fleet, self.agent.registry):
                log.info("demo: %s", problem)

    def stop(self) -> None:
        # The fleet first: its members die with the agent's thread too (PR_SET_PDEATHSIG
        # follows the thread that started them), and one SIGTERM each is enough.
        if self._fleet is not None:
            self._fleet.stop()
            self._fleet = None
        super().stop()


def start_embedded(*, interval: float = 0.5, demo: bool = False) -> EmbeddedAgent:
    """Start an embedded agent; the caller must call :meth:`EmbeddedAgent.stop`."""
    agent = EmbeddedAgent(interval=interval, demo=demo)
    agent.start()
    return agent
