"""``memagent daemon``: run the agent in the foreground until SIGTERM or SIGINT; SIGHUP
reads the configuration again. As a systemd service (docs/service.md): ``READY=1`` once it
listens, ``WATCHDOG=1`` while the tick loop keeps time, ``STOPPING=1`` on the way out
(:mod:`memagent.serve.notify`), and log lines journald files under their priority.

Import this module before anything imports asyncio, and call :func:`skip_tls_import`
first thing: see its docstring.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from memproto.text import printable

from .errors import ConfigError, DaemonAlreadyRunning, MetricsListenError, SocketPathError

if TYPE_CHECKING:  # the agent imports asyncio: not before skip_tls_import()
    from .agent import Agent
    from .config import AgentConfig
    from .serve.notify import Notifier

log = logging.getLogger("memagent")

#: The syslog priority (sd-daemon(3): ``<N>`` at the start of a line) of each level, from
#: the most severe down; below DEBUG: 7 too.
PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))


def priority(levelno: int) -> int:
    return next((p for level, p in PRIORITIES if levelno >= level), 7)


def stderr_is_journal(environ: Mapping[str, str] = os.environ, fd: int = 2) -> bool:
    """Whether ``fd`` is the stream systemd connected to the journal: ``$JOURNAL_STREAM``
    names its ``DEVICE:INODE`` (systemd.exec(5)). Compared with the descriptor itself, so a
    daemon whose stderr a wrapper redirected (to a file, a pipe) keeps the plain format."""
    expected = environ.get("JOURNAL_STREAM")
    if not expected:
        return False
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return expected == f"{st.st_dev}:{st.st_ino}"


class LineFormatter(logging.Formatter):
    """One event, one line: whatever a message holds (a name, a label, a traceback's
    newlines) is escaped by :func:`memproto.text.printable`, so no line can be forged and a
    traceback stays one journal entry. Under journald, the line starts with its priority
    (``<4>``) and drops the ``memagent: LEVEL:`` prefix, which the journal records itself."""

    def __init__(self, journal: bool) -> None:
        super().__init__("%(message)s" if journal else "memagent: %(levelname)s: %(message)s")
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        line = printable(super().format(record))
        return f"<{priority(record.levelno)}>{line}" if self.journal else line


def setup_logging(verbose: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter(stderr_is_journal()))
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


def reload(agent: Agent, notifier: Notifier) -> bool:
    """SIGHUP: build the configuration again as at start (the same file, the same flags)
    and apply it live (:meth:`Agent.reload`). Invalid, the running one stays whole and one
    line says why, as ``check-config`` would. Whether it was applied."""
    source = agent.config.source
    if source is None:
        log.warning("SIGHUP: no configuration to read again (not started from the command line)")
        return False
    notifier.reloading()
    where = printable(source.path) if source.path else "the defaults and flags (no configuration file)"
    try:
        applied, kept = agent.reload(source.load())
    except ConfigError as exc:
        log.error("reload: invalid configuration: %s; still running on the previous configuration", exc)
        notifier.ready(f"reload failed: invalid configuration: {exc}; running on the previous configuration")
        return False
    done = f"applied {', '.join(applied)}" if applied else "nothing to apply"
    if kept:
        log.warning("reloaded %s: %s; %s changed but only a restart applies %s (running value kept)", where,
                    done, ", ".join(kept), "it" if len(kept) == 1 else "them")
    else:
        log.info("reloaded %s: %s", where, done)
    notifier.ready(f"reloaded: {agent.summary()}")
    return True


async def _serve(agent: Agent, notifier: Notifier) -> None:
    import asyncio

    from .serve.notify import Notifier

    stop = asyncio.Event()
    ready = asyncio.Event()
    loop = asyncio.get_running_loop()

    def shut_down() -> None:
        if not stop.is_set():
            notifier.stopping()
        stop.set()

    def hang_up() -> None:
        if not stop.is_set():  # on the way out, the parts a reload touches are closing
            # Before READY=1 (a SIGHUP while starting), its READY=1 would come too early.
            reload(agent, notifier if ready.is_set() else Notifier(None))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, shut_down)
    loop.add_signal_handler(signal.SIGHUP, hang_up)
    running = asyncio.ensure_future(agent.run(stop, ready))
    listening = asyncio.ensure_future(ready.wait())
    await asyncio.wait((running, listening), return_when=asyncio.FIRST_COMPLETED)
    listening.cancel()
    if not ready.is_set():  # it could not start: run() raises why
        await running
        return
    notifier.ready(agent.summary())
    watchdog = asyncio.ensure_future(notifier.feed_watchdog(agent.on_time, agent.summary))
    try:
        await running
    finally:
        watchdog.cancel()


def run_daemon(config: AgentConfig) -> int:
    import asyncio

    from .agent import Agent
    from .serve.notify import Notifier

    notifier = Notifier.from_environment()
    try:
        agent = Agent(config)
    except ConfigError as exc:
        print(f"memagent: invalid configuration: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(agent, notifier))
    except DaemonAlreadyRunning as exc:
        print(f"memagent: {exc}; not starting another", file=sys.stderr)
        return 1
    except (SocketPathError, PermissionError) as exc:
        print(f"memagent: cannot listen on {config.socket}: {exc}", file=sys.stderr)
        return 1
    except MetricsListenError as exc:
        print(f"memagent: {exc}", file=sys.stderr)
        return 1
    finally:
        notifier.close()
    return 0
