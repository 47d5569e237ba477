"""``memagent daemon``: run the agent in the foreground until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from .agent import Agent, AgentConfig
from .server import DaemonAlreadyRunning, SocketPathError

log = logging.getLogger("memagent")


def setup_logging(verbose: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("memagent: %(levelname)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


async def _serve(agent: Agent) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await agent.run(stop)


def run_daemon(config: AgentConfig) -> int:
    try:
        agent = Agent(config)
    except (ValueError, KeyError) as exc:
        print(f"memagent: invalid configuration: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(agent))
    except DaemonAlreadyRunning as exc:
        print(f"memagent: {exc}; not starting another", file=sys.stderr)
        return 1
    except (SocketPathError, PermissionError) as exc:
        print(f"memagent: cannot listen on {config.socket}: {exc}", file=sys.stderr)
        return 1
    return 0
