"""memtop and its terminal: it needs one to start, and it ends when the terminal goes.

A closed terminal (terminal window closed, tmux session killed, SSH dropped) hangs the
tty up: the kernel sends SIGHUP to the session's leader only (a shell, ``make``, which
may ignore it), reads answer EOF and writes EIO. Textual's input thread then spins on
EOF and its output thread dies on EIO, blocking the app's loop on a full queue, so the app
cannot be relied on to notice. :class:`TerminalWatch` does: a thread blocked in
``poll()`` on the terminal's descriptors wakes on ``POLLHUP``/``POLLERR`` (or on SIGHUP,
even where it was inherited as ignored), stops the embedded agent and its demo fleet, asks
the app to exit, and ends the process with :data:`HANGUP_EXIT` if the app has not
returned within :data:`GRACE` seconds.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

#: The exit status after the terminal went away (128 + SIGHUP, as a shell reports it).
HANGUP_EXIT = 128 + signal.SIGHUP
#: Seconds the app has to exit by itself once the terminal is gone.
GRACE = 0.4
NO_TERMINAL = ("memtop: needs a terminal (stdin and stdout are not both one); "
               "for the same figures as text, use `memagent ls` or `memagent status`")
_GONE = select.POLLHUP | select.POLLERR | select.POLLNVAL


def has_terminal() -> bool:
    """Whether stdin and stdout are both terminals (without one Textual writes escape codes
    to whatever stdout is, forever)."""
    return all(f is not None and f.isatty() for f in (sys.stdin, sys.stdout))


class TerminalWatch:
    """While entered: when the terminal hangs up or SIGHUP arrives, run ``on_lost`` (in the
    watch's thread), then exit the process with :data:`HANGUP_EXIT` unless :meth:`close`
    is called (the app returned) within :data:`GRACE` seconds. Enter it in the main thread
    (it sets the SIGHUP handler)."""

    def __init__(self, on_lost: Callable[[], object], fds: tuple[int, ...] = (0, 1)) -> None:
        self.on_lost = on_lost
        self.fds = fds
        self._wake_r, self._wake_w = os.pipe()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="memtop-terminal", daemon=True)
        self._old_handler: Any = None

    def __enter__(self) -> TerminalWatch:
        self._old_handler = signal.signal(signal.SIGHUP, self._on_sighup)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """The app returned: stop watching (an exit already under way completes)."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._thread.join()
        if self._old_handler is not None:  # None: set outside Python, cannot be put back
            signal.signal(signal.SIGHUP, self._old_handler)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _on_sighup(self, signum: int, frame: FrameType | None) -> None:
        # In the main thread, which may be stuck behind the dead terminal: hand it over.
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"h")

    def _watch(self) -> None:
        poller = select.poll()
        for fd in set(self.fds):
            poller.register(fd, 0)  # no readiness asked for: only hang-ups and errors wake us
        poller.register(self._wake_r, select.POLLIN)
        while True:
            events = poller.poll()
            if self._closed.is_set():
                return
            if any(fd != self._wake_r and mask & _GONE for fd, mask in events):
                break
            if any(fd == self._wake_r for fd, _ in events) and os.read(self._wake_r, 1) == b"h":
                break
        try:
            self.on_lost()
        finally:
            if not self._closed.wait(GRACE):
                os._exit(HANGUP_EXIT)
