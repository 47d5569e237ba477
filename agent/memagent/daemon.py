"""``memagent daemon``: run the agent in the foreground until SIGTERM or SIGINT.

Import this module before anything imports asyncio, and call :func:`skip_tls_import`
first thing: see its docstring.
"""

from __future__ import annotations

import logging
import signal
import sys
from typing import TYPE_CHECKING

from .errors import ConfigError, DaemonAlreadyRunning, SocketPathError

if TYPE_CHECKING:  # the agent imports asyncio: not before skip_tls_import()
    from .agent import Agent
    from .config import AgentConfig

log = logging.getLogger("memagent")


def setup_logging(verbose: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("memagent: %(levelname)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


def skip_tls_import() -> bool:
    """Keep the daemon's memory small where it costs nothing.

    The daemon never speaks TLS, but asyncio imports :mod:`ssl` when it can, which costs
    about 4 MB of RSS (measured: 23.8 MB -> 19.6 MB for an idle daemon) on a box where
    memory is the whole point. Marking ``ssl`` as unavailable before asyncio is first
    imported makes that import fail, which asyncio handles (``ssl = None``). Call before
    anything imports asyncio; returns whether it took effect.
    """
    if "asyncio" in sys.modules or "ssl" in sys.modules:
        return False
    sys.modules["ssl"] = None  # type: ignore[assignment]
    return True


async def _serve(agent: Agent) -> None:
    import asyncio

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await agent.run(stop)


def run_daemon(config: AgentConfig) -> int:
    import asyncio

    from .agent import Agent

    try:
        agent = Agent(config)
    except ConfigError as exc:
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
