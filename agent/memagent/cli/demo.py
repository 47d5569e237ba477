"""``memagent demo``: an agent with the demo fleet attached, printing the process table
every second (the fleet's shapes: :mod:`memagent.demo_fleet`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time

from memproto.text import printable

from ..agent import Agent
from ..daemon import setup_logging
from ..demo_fleet import Fleet, attach_fleet, demo_config
from ..errors import DaemonAlreadyRunning, SocketPathError
from .render import format_table


def run_demo_printing(socket: str | None, seconds: float | None) -> int:
    """Run an agent with the fleet and print ``memagent ls`` every second; 1 with one line
    on stderr when the agent cannot listen on ``socket``."""
    setup_logging()
    path = socket or os.path.join(tempfile.mkdtemp(prefix="memagent-demo-"), "memagent.sock")
    agent = Agent(demo_config(path, 0.5))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        ready = asyncio.Event()
        serving = asyncio.ensure_future(agent.run(stop, ready))
        listening = asyncio.ensure_future(ready.wait())
        await asyncio.wait({serving, listening}, return_when=asyncio.FIRST_COMPLETED)
        if serving.done():  # it could not start: its error, not a wait for ever
            listening.cancel()
            serving.result()
            return
        with Fleet() as fleet:
            for problem in await attach_fleet(fleet, agent.registry):
                print(f"demo: {problem}", file=sys.stderr)
            print(f"demo agent on {path}: try `memagent --socket {path} ls` elsewhere; Ctrl-C stops")
            started = time.monotonic()
            while not stop.is_set():
                if seconds is not None and time.monotonic() - started >= seconds:
                    break
                print(format_table([w.info() for w in agent.registry.entries.values()]), flush=True)
                print(flush=True)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
            stop.set()
        await serving

    try:
        asyncio.run(main())
    except DaemonAlreadyRunning as exc:
        print(f"memagent: {exc}; not starting a demo there", file=sys.stderr)
        return 1
    except (SocketPathError, PermissionError) as exc:
        print(f"memagent: cannot listen on {printable(path)}: {exc}", file=sys.stderr)
        return 1
    return 0
