"""The alert hook: a command from the config that receives each alert as JSON on stdin.

It runs with a timeout and is killed past it; a hook that fails, hangs or is missing is
logged and never stops the daemon. At most ``MAX_RUNNING`` run at once; alerts beyond
that wait their turn (in order), so a burst cannot fork-bomb the box.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os

from memproto.records import Alert
from memproto.schema import to_wire

log = logging.getLogger(__name__)

MAX_RUNNING = 4


def alert_json(alert: Alert) -> str:
    return json.dumps(to_wire(alert), separators=(",", ":"))


class HookRunner:
    def __init__(self, argv: list[str], timeout: float) -> None:
        self.argv = argv
        self.timeout = timeout
        self.ran = 0
        self.failed = 0
        self._sem: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, alert: Alert) -> None:
        if not self.argv:
            return
        if self._sem is None:
            self._sem = asyncio.Semaphore(MAX_RUNNING)
        task = asyncio.ensure_future(self._run(alert))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, alert: Alert) -> None:
        assert self._sem is not None
        async with self._sem:
            self.ran += 1
            what = f"hook for alert {alert.id} ({alert.kind} {alert.state})"
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.PIPE, env={**os.environ, "MEMAGENT_ALERT_KIND": alert.kind},
                )
            except OSError as exc:
                self.failed += 1
                log.error("%s could not start: %s: %s", what, self.argv[0], exc.strerror)
                return
            try:
                _, err = await asyncio.wait_for(proc.communicate(alert_json(alert).encode() + b"\n"), self.timeout)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                self.failed += 1
                log.error("%s did not finish within %g s: killed", what, self.timeout)
                return
            if proc.returncode != 0:
                self.failed += 1
                tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
                log.error("%s exited with %d: %s", what, proc.returncode, tail[0][:200])

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
