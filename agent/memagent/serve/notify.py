"""Telling systemd how the daemon is doing: the ``sd_notify`` protocol, by hand.

Why by hand: the protocol is one datagram of ``KEY=VALUE`` lines to the ``AF_UNIX``
socket named in ``$NOTIFY_SOCKET`` (a path, or ``@name`` in the abstract namespace), and
libsystemd (or a binding of it) would be a dependency for a dozen lines. Under the
packaged unit (``Type=notify``, ``WatchdogSec=``; see docs/service.md):

* ``READY=1`` once the socket listens, so ``systemctl start`` returns when clients can
  connect; ``RELOADING=1`` then ``READY=1`` around a SIGHUP's reload; ``STOPPING=1`` as
  soon as SIGTERM arrives; ``STATUS=`` lines for ``systemctl status``.
* ``WATCHDOG=1`` at half of ``$WATCHDOG_USEC``, only while the tick loop keeps its
  deadlines (:meth:`Notifier.feed_watchdog`): a hung tick loop, or an event loop blocked
  for good, stops the pings and systemd restarts the daemon.

Without ``$NOTIFY_SOCKET`` (a terminal, the tests' own daemons) nothing is sent. The
variables are taken out of the environment once read: py-spy runs with the daemon's
environment and must not talk to systemd in its name. A datagram that cannot be sent is
logged once and never stops the daemon: the socket is non-blocking, so a manager that
does not read cannot hold the loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, MutableMapping

log = logging.getLogger(__name__)

ENV_SOCKET = "NOTIFY_SOCKET"
ENV_WATCHDOG_USEC = "WATCHDOG_USEC"
ENV_WATCHDOG_PID = "WATCHDOG_PID"


def notify_address(value: str | None) -> str | None:
    """The address ``$NOTIFY_SOCKET`` names (``@x``: abstract ``\\0x``); None when unset
    or of a kind this daemon does not speak (``vsock:``: not on the boxes it runs on)."""
    if not value:
        return None
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    log.warning("NOTIFY_SOCKET=%r is neither a path nor @abstract: not notifying systemd", value)
    return None


def watchdog_period(usec: str | None, pid: str | None, own_pid: int) -> float | None:
    """Seconds between two ``WATCHDOG=1`` (half of ``$WATCHDOG_USEC``, as sd_watchdog_enabled(3)
    advises); None without a watchdog, or when ``$WATCHDOG_PID`` names another process."""
    if not usec:
        return None
    if pid and pid != str(own_pid):
        return None
    try:
        value = int(usec)
    except ValueError:
        log.warning("WATCHDOG_USEC=%r is not a number: no watchdog pings", usec)
        return None
    return value / 2e6 if value > 0 else None


class Notifier:
    """Sends sd_notify datagrams; does nothing when ``address`` is None."""

    def __init__(self, address: str | None, watchdog: float | None = None) -> None:
        self.address = address
        #: Seconds between two watchdog pings; None: systemd watches nothing.
        self.watchdog = watchdog if address is not None else None
        self._sock: socket.socket | None = None
        self._failed = False

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str] = os.environ) -> Notifier:
        """The notifier ``environ`` describes; the three variables are removed from it."""
        address = notify_address(environ.pop(ENV_SOCKET, None))
        period = watchdog_period(environ.pop(ENV_WATCHDOG_USEC, None), environ.pop(ENV_WATCHDOG_PID, None),
                                 os.getpid())
        return cls(address, period)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> bool:
        """One datagram of ``KEY=VALUE`` fields (newlines in a value would start a new
        field: they become spaces). Whether it left."""
        if self.address is None:
            return False
        data = "\n".join(f.replace("\n", " ") for f in fields).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto(data, self.address)
        except OSError as exc:
            if not self._failed:
                self._failed = True
                log.warning("cannot notify systemd at %s: %s", self.address.replace("\0", "@"), exc.strerror)
            return False
        self._failed = False
        return True

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}")

    def reloading(self) -> bool:
        # MONOTONIC_USEC: systemd 253+ matches it against the time the reload was asked for.
        return self.send("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")

    def stopping(self, status: str = "stopping") -> bool:
        return self.send("STOPPING=1", f"STATUS={status}")

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={status}")

    async def feed_watchdog(self, on_time: Callable[[float], bool], status: Callable[[], str]) -> None:
        """Ping every :attr:`watchdog` seconds while ``on_time(slack)`` says the tick loop
        keeps its deadlines (its next tick not overdue by more than ``slack``); each ping
        carries a fresh ``STATUS=``. Returns at once without a watchdog."""
        period = self.watchdog
        if period is None:
            return
        late = False
        while True:
            if on_time(period):
                late = False
                self.send("WATCHDOG=1", f"STATUS={status()}")
            elif not late:
                late = True
                log.error("the tick loop is more than %g s behind: no watchdog ping (systemd restarts the daemon "
                          "if it stays so)", period)
            await asyncio.sleep(period)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
