"""The metrics exposition leaves the daemon (docs/metrics.md): an HTTP ``/metrics``
endpoint (``[metrics] listen``) and a textfile for node_exporter (``[metrics] textfile``).

Both run on the agent's event loop, not in a thread: with the GIL, a thread rendering a
scrape would take the interpreter from the tick for up to the switch interval (5 ms)
each time the tick gives it up for a system call, hundreds of times per tick. On the
loop, a scrape is served between ticks: the snapshot is taken and rendered one family at
a time, giving way to a tick that is due (:class:`~memagent.core.pacing.Pacer`), so a
tick is late by at most one family's rendering (~0.3 ms at 1000 processes). Only the
textfile's write and fsync go to a worker thread (they hold no GIL while they wait).

The HTTP side is the least a scraper needs: ``GET`` or ``HEAD`` of ``/metrics``, the
Prometheus text format, or OpenMetrics when the ``Accept`` header names it; one request
per connection. A client gets :data:`HEAD_TIMEOUT` seconds and :data:`MAX_HEAD` bytes for
its request, and at most :data:`MAX_CONNECTIONS` are held at once; when all are taken, a
new one closes the oldest that has not sent its request yet (a scraper sends it at once),
so connections that say nothing cannot lock scrapes out. One that says nothing, or says
nonsense, costs a socket for a while and never the tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time

from memproto.text import printable

from ..config import MetricsConfig, copy_live, split_listen
from ..core.pacing import Pacer
from ..core.sampler import Ticker
from ..errors import MetricsListenError
from ..store.files import write_atomically
from .exposition import OPENMETRICS_TYPE, TEXT_TYPE, render
from .snapshot import MetricsSnapshotSource

log = logging.getLogger(__name__)

#: Seconds a client has to send its request, and to take the answer.
HEAD_TIMEOUT = 5.0
WRITE_TIMEOUT = 10.0
#: The request line and headers together, at most (bytes).
MAX_HEAD = 16 * 1024
MAX_CONNECTIONS = 16
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


def wants_openmetrics(accept: str) -> bool:
    """Content negotiation as prometheus-client does it: OpenMetrics when the client
    accepts it at all (Prometheus asks for it first), else the text format."""
    return any(part.split(";")[0].strip() == "application/openmetrics-text" for part in accept.split(","))


def response(status: int, body: bytes, content_type: str = "text/plain; charset=utf-8", head: bool = False) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS[status]}", f"Content-Type: {content_type}",
             f"Content-Length: {len(body)}", "Connection: close"]
    if status == 405:
        lines.append("Allow: GET, HEAD")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (b"" if head else body)


def parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """(method, path, headers with lower-case names) of a request; ValueError if it is
    not an HTTP/1.x request."""
    text = head.decode("latin-1")
    first, *rest = text.split("\r\n")
    method, target, version = first.split(" ")  # ValueError unless exactly three parts
    if not version.startswith("HTTP/1.") or not method.isalpha() or not target.startswith("/"):
        raise ValueError(first)
    headers = {}
    for line in rest:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return method, target.split("?", 1)[0], headers


class MetricsExporter:
    def __init__(self, config: MetricsConfig, source: MetricsSnapshotSource, ticker: Ticker) -> None:
        self.config = config  # the agent's own: a reload changes it in place
        self.source = source
        self.ticker = ticker
        self.pacer = Pacer(ticker)
        self.server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()
        #: The connections still waiting for their request, oldest first (dicts keep order).
        self._waiting: dict[asyncio.Task[None], None] = {}
        self._textfile_failing: str | None = None

    # ------------------------------------------------------------------ the exposition

    def apply(self, config: MetricsConfig) -> None:
        """A reload: the live keys of ``[metrics]`` into the running config (the textfile,
        its interval, the TTL and per_process); the endpoint stays bound until a restart."""
        copy_live(self.config, config)

    async def exposition(self, openmetrics: bool = False) -> bytes:
        """The exposition now, rendered between ticks (see the module's docstring)."""
        pace = self.pacer.start()
        await pace.pause()
        snapshot = self.source.take(time.time())
        chunks = []
        for chunk in render(snapshot, openmetrics):
            chunks.append(chunk)
            await pace.pause()
        return "".join(chunks).encode("utf-8")

    # ------------------------------------------------------------------ HTTP

    async def start(self) -> None:
        """Bind the endpoint, if one is configured; MetricsListenError (one line) if not possible."""
        if self.config.listen is None:
            return
        host, port = split_listen(self.config.listen)
        try:
            self.server = await asyncio.start_server(self._accept, host, port, limit=MAX_HEAD)
        except OSError as exc:
            # asyncio rewords it ("error while attempting to bind on address ..."): errno says it plainly.
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            where = self.config.listen
            raise MetricsListenError(f"cannot listen on {where} for metrics: {printable(reason)}") from None
        bound = self.server.sockets[0].getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        log.info("metrics: serving http://%s:%d/metrics", shown, bound[1])

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._clients) >= MAX_CONNECTIONS:
            if not self._waiting:  # all of them being answered: this one waits for none
                writer.close()
                return
            next(iter(self._waiting)).cancel()  # its finally closes it
        task = asyncio.ensure_future(self._serve(reader, writer))
        self._clients.add(task)
        self._waiting[task] = None
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._clients.discard(task)
        self._waiting.pop(task, None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
                self._waiting.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
                method, path, headers = parse_head(head)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError):
                writer.write(response(400, b"not an HTTP/1.x request\n"))
            else:
                writer.write(await self._answer(method, path, headers))
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)
        except (OSError, asyncio.TimeoutError):
            pass  # the client went away, or does not read: nothing to tell it
        finally:
            writer.close()

    async def _answer(self, method: str, path: str, headers: dict[str, str]) -> bytes:
        if method not in ("GET", "HEAD"):
            return response(405, b"only GET and HEAD\n")
        head = method == "HEAD"
        if path == "/":
            return response(200, b"memagent: the metrics are at /metrics\n", head=head)
        if path != "/metrics":
            return response(404, b"not found: the metrics are at /metrics\n", head=head)
        openmetrics = wants_openmetrics(headers.get("accept", ""))
        body = await self.exposition(openmetrics)
        return response(200, body, OPENMETRICS_TYPE if openmetrics else TEXT_TYPE, head=head)

    # ------------------------------------------------------------------ textfile

    async def run_textfile(self) -> None:
        """Every ``textfile_interval`` from the first tick on, while a textfile is set
        (read each time: a reload may set, move or remove it)."""
        await self.ticker.next_tick()
        loop = asyncio.get_running_loop()
        while True:
            path = self.config.textfile
            if path is not None:
                data = await self.exposition()
                try:
                    await loop.run_in_executor(None, write_atomically, path, data)
                except OSError as exc:
                    self._failed(path, printable(exc.strerror or str(exc)))
                else:
                    if self._textfile_failing is not None:
                        log.info("metrics: textfile %s written again", printable(path))
                    self._textfile_failing = None
            await asyncio.sleep(self.config.textfile_interval)

    def _failed(self, path: str, reason: str) -> None:
        """One warning line when writing starts failing (or fails otherwise), not one per try."""
        if self._textfile_failing != reason:
            log.warning("metrics: cannot write the textfile %s: %s; trying again every %g s", printable(path),
                        reason, self.config.textfile_interval)
        self._textfile_failing = reason

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self._clients):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._clients, return_exceptions=True)
        if self.server is not None:
            await self.server.wait_closed()
