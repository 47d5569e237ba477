"""The alert hook: a command from the config that receives each alert as JSON on stdin.

Alerts can be made to fire by any client (its own processes, the labels it gives them),
so the hook is treated as something a client can trigger at will:

* **Who.** When the daemon is root, the hook runs as ``[alerts] hook_user`` (``nobody``
  by default; UID, GID and home looked up once, at start), with no supplementary groups.
  Not root, the daemon cannot switch: the hook runs as the daemon's user, said once in
  the log.
* **What it sees.** A minimal environment (``PATH``, ``LANG=C.UTF-8``, ``HOME``,
  ``MEMAGENT_ALERT_KIND``), nothing of the daemon's own; the working directory is ``/``;
  a session of its own, so a timeout kills what it started too.
* **How often.** Per alert key ``(kind, resource)``, at most one run per
  ``hook_min_interval`` seconds: a newer alert for a key whose window is still open
  waits, and only the latest one per key does (coalesced), so the state the hook sees
  last is the alert's last state (a ``resolved`` is delayed, never lost). For the whole
  daemon, at most ``hook_rate`` runs per second, ``hook_burst`` at once after a lull (a
  token bucket). Alerts that wait are kept in a map keyed by alert key, of at most
  ``max_waiting`` keys: memory is bounded by the number of distinct keys.
* **How long, how many.** A hook runs at most ``timeout`` seconds, then it is killed; at
  most :data:`MAX_RUNNING` run at once (the others wait in the map). A hook that fails,
  hangs or is missing is logged and never stops the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pwd
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memproto.records import Alert
from memproto.schema import to_wire
from memproto.text import printable
from memproto.vocabulary import AlertState

from ..config import HOOK_PATH, lookup_user

log = logging.getLogger(__name__)

MAX_RUNNING = 4
#: Distinct alert keys that may wait for their turn at once.
MAX_WAITING = 1024
#: The hook's whole environment, with ``HOME`` and ``MEMAGENT_ALERT_KIND``.
LANG = "C.UTF-8"

Key = tuple[str, str]


def alert_json(alert: Alert) -> str:
    return json.dumps(to_wire(alert), separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class HookUser:
    """Whom the hook runs as: ``switch`` when the daemon changes to that user itself."""

    name: str
    uid: int
    gid: int
    home: str
    switch: bool


def resolve_hook_user(name: str) -> HookUser:
    """``name`` when the daemon is root (it must exist); else the daemon's own user."""
    if os.geteuid() == 0:
        pw = lookup_user(name)
        return HookUser(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir or "/", switch=True)
    uid = os.geteuid()
    try:
        own = pwd.getpwuid(uid)
        me, home = own.pw_name, own.pw_dir or "/"
    except KeyError:
        me, home = str(uid), "/"
    return HookUser(me, uid, os.getegid(), home, switch=False)


def _kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL to the hook's session (it runs in one of its own): what it started goes too."""
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except PermissionError:  # no CAP_KILL over the hook's user (a unit that dropped it)
            log.error("hook pid %d: cannot kill it at its timeout (permission denied): it runs on", proc.pid)


class HookRunner:
    def __init__(self, argv: list[str], timeout: float, user: str = "nobody", min_interval: float = 10.0,
                 rate: float = 1.0, burst: int = 5, max_waiting: int = MAX_WAITING,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.argv = argv
        self.timeout = timeout
        self.min_interval = min_interval
        self.rate = rate
        self.burst = max(1, burst)
        self.max_waiting = max(1, max_waiting)
        self.clock = clock
        self.user: HookUser | None = None
        if argv:
            self.user = resolve_hook_user(user)
            if not self.user.switch:
                log.info("the daemon is not root: [alerts] hook_user %r is ignored; the hook runs as %s (uid %d)",
                         user, printable(self.user.name), self.user.uid)
        #: Hooks started, hooks that failed (could not start, non-zero exit, killed).
        self.ran = 0
        self.failed = 0
        #: Alerts that waited (rate limits), that a newer alert of their key replaced while
        #: waiting (never run), and that were dropped because ``max_waiting`` keys waited.
        self.delayed = 0
        self.coalesced = 0
        self.dropped = 0
        self._waiting: dict[Key, Alert] = {}  # in order of first waiting; latest alert per key
        self._last_start: dict[Key, float] = {}  # keys with a run within min_interval
        self._coalescing: set[Key] = set()  # keys whose coalescing was logged (until a quiet window)
        self._tokens = float(self.burst)
        self._refilled: float | None = None
        self._running = 0
        self._throttled = False  # the global rate made alerts wait (logged once per episode)
        self._full = False  # the waiting map was full (logged once per episode)
        self._tasks: set[asyncio.Task[None]] = set()
        self._pump: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def waiting(self) -> int:
        """Alert keys waiting for their turn (at most ``max_waiting``)."""
        return len(self._waiting)

    # ------------------------------------------------------------------ admission

    def submit(self, alert: Alert) -> None:
        if not self.argv:
            return
        key = (alert.kind, alert.resource)
        now = self.clock()
        self._refill(now)
        self._prune(now)
        if not self._waiting and self._may_start(key, now):
            self._start(key, alert, now)
            return
        self._wait(key, alert)
        if self._pump is None:
            self._pump = asyncio.ensure_future(self._dispatch())
        self._wake.set()

    def _may_start(self, key: Key, now: float) -> bool:
        return self._running < MAX_RUNNING and self._due(key) <= now and self._tokens >= 1

    def _due(self, key: Key) -> float:
        last = self._last_start.get(key)
        return float("-inf") if last is None else last + self.min_interval

    def _refill(self, now: float) -> None:
        if self._refilled is not None:
            self._tokens = min(float(self.burst), self._tokens + (now - self._refilled) * self.rate)
        self._refilled = now

    def _prune(self, now: float) -> None:
        """Forget the keys whose window has passed (at most burst + rate * window remain)."""
        for key in [k for k, t in self._last_start.items() if t + self.min_interval <= now]:
            if key not in self._waiting:
                del self._last_start[key]
                self._coalescing.discard(key)

    def _wait(self, key: Key, alert: Alert) -> None:
        if key in self._waiting:
            self.delayed += 1
            self.coalesced += 1
            if key not in self._coalescing:
                self._coalescing.add(key)
                log.warning("hook: alerts for %s %s come faster than the hook may run (once per %g s for a key, "
                            "%g times a second in all): only the latest waiting one will run", key[0],
                            printable(key[1]), self.min_interval, self.rate)
            self._waiting[key] = alert  # keeps its place in the line
            return
        if len(self._waiting) >= self.max_waiting and not self._make_room(alert):
            return
        self.delayed += 1
        self._idle.clear()
        self._waiting[key] = alert

    def _make_room(self, alert: Alert) -> bool:
        """The map is full and ``alert`` has a new key: a ``resolved`` one takes the place
        of the oldest waiting ``firing`` one; otherwise ``alert`` is dropped."""
        self.dropped += 1
        if not self._full:
            self._full = True
            log.warning("hook: %d alert keys already wait; further alerts are dropped (resolutions first "
                        "take the place of waiting firing alerts)", len(self._waiting))
        if alert.state != AlertState.RESOLVED:
            return False
        victim = next((k for k, a in self._waiting.items() if a.state != AlertState.RESOLVED), None)
        if victim is None:
            return False
        del self._waiting[victim]
        return True

    # ------------------------------------------------------------------ dispatch

    async def _dispatch(self) -> None:
        """Start waiting alerts as their key's window, the global rate and the running
        limit allow; sleep until the earliest of those changes."""
        while self._waiting:
            now = self.clock()
            self._refill(now)
            wake_at: float | None = None
            for key in list(self._waiting):
                if self._running >= MAX_RUNNING:
                    break  # a run that ends wakes us
                due = self._due(key)
                if due > now:
                    wake_at = due if wake_at is None else min(wake_at, due)
                    continue
                if self._tokens < 1:
                    if not self._throttled:
                        self._throttled = True
                        log.warning("hook: more than %g runs per second (burst %d) wanted: alerts wait",
                                    self.rate, self.burst)
                    ready = now + (1 - self._tokens) / self.rate
                    wake_at = ready if wake_at is None else min(wake_at, ready)
                    break
                self._start(key, self._waiting.pop(key), now)
            self._prune(now)
            if not self._waiting:
                break
            self._wake.clear()
            timeout = None if wake_at is None else max(0.0, wake_at - now)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
        self._pump = None
        self._throttled = self._full = False
        self._check_idle()

    def _start(self, key: Key, alert: Alert, now: float) -> None:
        self._tokens -= 1
        self._last_start[key] = now
        self._running += 1
        self._idle.clear()
        task = asyncio.ensure_future(self._run(alert))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _check_idle(self) -> None:
        if not self._waiting and self._running == 0:
            self._idle.set()

    async def drained(self) -> None:
        """Wait until no alert waits and no hook runs."""
        await self._idle.wait()

    # ------------------------------------------------------------------ one run

    async def _run(self, alert: Alert) -> None:
        try:
            await self._exec(alert)
        finally:
            self._running -= 1
            self._wake.set()
            self._check_idle()

    async def _exec(self, alert: Alert) -> None:
        assert self.user is not None
        self.ran += 1
        what = f"hook for alert {alert.id} ({alert.kind} {alert.state})"
        env = {"PATH": HOOK_PATH, "LANG": LANG, "HOME": self.user.home, "MEMAGENT_ALERT_KIND": alert.kind}
        switch: dict[str, Any] = (
            {"user": self.user.uid, "group": self.user.gid, "extra_groups": []} if self.user.switch else {})
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, env=env, cwd="/", start_new_session=True, **switch,
            )
        except OSError as exc:
            self.failed += 1
            log.error("%s could not start as %s: %s: %s", what, printable(self.user.name), self.argv[0],
                      exc.strerror)
            return
        try:
            _, err = await asyncio.wait_for(proc.communicate(alert_json(alert).encode() + b"\n"), self.timeout)
        except asyncio.TimeoutError:
            _kill(proc)
            await proc.wait()
            self.failed += 1
            log.error("%s did not finish within %g s: killed", what, self.timeout)
            return
        except asyncio.CancelledError:  # close(): the daemon stops
            _kill(proc)
            raise
        if proc.returncode != 0:
            self.failed += 1
            tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            log.error("%s exited with %d: %s", what, proc.returncode, printable(tail[0][:200]))

    async def close(self) -> None:
        """Stop: waiting alerts are dropped, running hooks cancelled."""
        if self._waiting:
            log.info("hook: %d waiting alerts not delivered at shutdown", len(self._waiting))
            self._waiting.clear()
        tasks = list(self._tasks) + ([self._pump] if self._pump is not None else [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pump = None
