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

Kernel memory is bounded per connection (docs/security.md §7): the sockets are served with
the loop's ``sock_*`` calls rather than streams, so that the daemon decides how much of an
answer the kernel holds (:data:`SEND_BUFFER`, :data:`CHUNK` at a time as the client takes
it) and how a connection ends: closed once the client has received everything, reset
(``SO_LINGER`` 0) otherwise, so that no orphaned socket keeps an answer that its client
never reads. At most :data:`PER_PEER` answers are in flight to one address; an answer
that has taken nothing for :data:`STALLED` seconds is reset when its place is wanted.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import socket
import struct
import sys
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memproto.text import printable

from ..config import MetricsConfig, copy_live, split_listen
from ..core.pacing import Pacer
from ..core.sampler import Ticker
from ..errors import MetricsListenError
from ..store.files import write_atomically

if TYPE_CHECKING:
    from .snapshot import MetricsSnapshotSource

log = logging.getLogger(__name__)

#: Seconds a client has to send its request, and to take the answer.
HEAD_TIMEOUT = 5.0
WRITE_TIMEOUT = 10.0
#: The request line and headers together, at most (bytes).
MAX_HEAD = 16 * 1024
MAX_CONNECTIONS = 16
#: Answers in flight to one client address at once (a further request from it: ``503``).
PER_PEER = 4
#: An answer that takes nothing for this long (seconds) may be reset to make room.
STALLED = 1.0
#: SO_SNDBUF of every connection (the kernel doubles it): what the kernel holds of an
#: answer at a time. The rest waits in the daemon, in :data:`CHUNK` pieces.
SEND_BUFFER = 32 * 1024
CHUNK = 16 * 1024
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


def wants_openmetrics(accept: str) -> bool:
    """Content negotiation as prometheus-client does it: OpenMetrics when the client
    accepts it at all (Prometheus asks for it first), else the text format."""
    return any(part.split(";")[0].strip() == "application/openmetrics-text" for part in accept.split(","))


Answer = tuple[bytes, bytes]


def response(status: int, body: bytes, content_type: str = "text/plain; charset=utf-8", head: bool = False) -> Answer:
    """The status line and headers, and the body (empty for ``HEAD``): apart, so that the
    body shared by the scrapes of a tick is sent as it is, not copied into each answer."""
    lines = [f"HTTP/1.1 {status} {REASONS[status]}", f"Content-Type: {content_type}",
             f"Content-Length: {len(body)}", "Connection: close"]
    if status == 405:
        lines.append("Allow: GET, HEAD")
    return ("\r\n".join(lines) + "\r\n\r\n").encode(), (b"" if head else body)


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


@dataclass(eq=False, slots=True)
class Connection:
    """One client of the endpoint, from its accept to its close."""

    sock: socket.socket
    #: The client's address without its port: answers in flight are counted per address.
    peer: str
    #: When it last made progress (accepted, request read, part of the answer taken), monotonic.
    progress: float
    task: asyncio.Task[None] | None = None
    #: True once its request is read and it is being answered.
    answering: bool = False

    def stalled(self, now: float) -> bool:
        """Being answered, and taking none of the answer for :data:`STALLED` seconds."""
        return self.answering and now - self.progress >= STALLED


def unsent(sock: socket.socket) -> int:
    """Bytes of the answer still in the kernel's send queue (sent, not yet acknowledged)."""
    return int.from_bytes(fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, bytes(4)), sys.byteorder, signed=True)


def abort(sock: socket.socket) -> None:
    """Close with a reset: the kernel frees the socket's send queue at once instead of
    keeping it as an orphan that the peer can hold open with zero-window answers."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def listening_sockets(host: str, port: int) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for ``host`` (``localhost``: each of its
    addresses), each with the small buffers every accepted socket inherits."""
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                  flags=socket.AI_PASSIVE):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, MAX_HEAD)
            sock.bind(address)
            sock.listen(128)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class MetricsExporter:
    def __init__(self, config: MetricsConfig, source: Callable[[], MetricsSnapshotSource], ticker: Ticker) -> None:
        """``source()`` builds what the snapshots are taken from, at the first exposition:
        an agent that serves none (``memagent run``'s, memtop's) never imports the snapshot
        and the renderer (issue 26: a run's start-up cost)."""
        self.config = config  # the agent's own: a reload changes it in place
        self._source_of = source
        self._source: MetricsSnapshotSource | None = None
        self.ticker = ticker
        self.pacer = Pacer(ticker)
        self.listeners: list[socket.socket] = []
        self._acceptors: list[asyncio.Task[None]] = []
        #: The connections held, in the order they came (dicts keep order).
        self._connections: dict[asyncio.Task[None], Connection] = {}
        #: The latest body of each format, and what it was rendered for (see :meth:`body`).
        self._bodies: dict[bool, tuple[tuple[int, str], asyncio.Future[bytes]]] = {}
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
        from .exposition import render

        if self._source is None:
            self._source = self._source_of()
        snapshot = self._source.take(time.time())
        chunks = []
        for chunk in render(snapshot, openmetrics):
            chunks.append(chunk)
            await pace.pause()
        return "".join(chunks).encode("utf-8")

    async def body(self, openmetrics: bool) -> bytes:
        """The exposition for a scrape: rendered once per tick and format, and shared by
        every scrape of that tick (the figures change only at a tick), so that clients
        answered at once hold one body between them, not one each."""
        key = (self.ticker.ticks, self.config.per_process)
        latest = self._bodies.get(openmetrics)
        if latest is None or latest[0] != key or (latest[1].done() and latest[1].exception() is not None):
            latest = (key, asyncio.ensure_future(self.exposition(openmetrics)))
            self._bodies[openmetrics] = latest
        return await asyncio.shield(latest[1])  # a client that leaves does not stop it for the others

    # ------------------------------------------------------------------ HTTP

    async def start(self) -> None:
        """Bind the endpoint, if one is configured; MetricsListenError (one line) if not possible."""
        if self.config.listen is not None or self.config.textfile is not None:
            # Imported now, not at the first scrape, between two ticks.
            from . import exposition  # noqa: F401

            self._source = self._source_of()
        if self.config.listen is None:
            return
        host, port = split_listen(self.config.listen)
        try:
            self.listeners = listening_sockets(host, port)
        except OSError as exc:
            reason = exc.strerror if isinstance(exc, socket.gaierror) or not exc.errno else os.strerror(exc.errno)
            where = self.config.listen
            raise MetricsListenError(f"cannot listen on {where} for metrics: {printable(str(reason))}") from None
        self._acceptors = [asyncio.ensure_future(self._accept_from(sock)) for sock in self.listeners]
        bound = self.listeners[0].getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        log.info("metrics: serving http://%s:%d/metrics", shown, bound[1])

    async def _accept_from(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(listener)
            except OSError as exc:  # out of descriptors, or the client left before the accept
                # A failed accept returns without yielding: never a busy loop that holds the tick.
                full = exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
                await asyncio.sleep(0.1 if full else 0)
                continue
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
                # Each chunk leaves at once: Nagle would hold a chunk smaller than a segment
                # until the client acknowledges the previous one, up to its delayed ACK (40 ms).
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # reset by the client already
                sock.close()
                continue
            self._admit(sock, str(address[0]))

    def _admit(self, sock: socket.socket, peer: str) -> None:
        """Hold a new connection, making room if all :data:`MAX_CONNECTIONS` are taken:
        the oldest that has not sent its request goes first, else the answer stalled the
        longest; if every one is a request being answered and taken, the new one is reset."""
        now = time.monotonic()
        if len(self._connections) >= MAX_CONNECTIONS:
            victim = next((c for c in self._connections.values() if not c.answering), None) or self._stalled(now)
            if victim is None:
                abort(sock)
                return
            self._evict(victim)
        conn = Connection(sock, peer, now)
        conn.task = asyncio.ensure_future(self._serve(conn))
        self._connections[conn.task] = conn
        conn.task.add_done_callback(self._forget)

    def _stalled(self, now: float, peer: str | None = None) -> Connection | None:
        """The answer (to ``peer``, or to anyone) that has taken nothing for longest, if stalled."""
        stalled = [c for c in self._connections.values() if c.stalled(now) and peer in (None, c.peer)]
        return min(stalled, key=lambda c: c.progress, default=None)

    def _evict(self, conn: Connection) -> None:
        assert conn.task is not None
        del self._connections[conn.task]  # now: the slot is free before its task has ended
        conn.task.cancel()  # its finally resets the connection

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._connections.pop(task, None)

    def _may_answer(self, conn: Connection) -> bool:
        """Room for one more answer to this client's address (:data:`PER_PEER`), made by
        resetting that address's most stalled answer if it is at its share."""
        now = time.monotonic()
        peers = sum(1 for c in self._connections.values() if c.answering and c.peer == conn.peer)
        if peers >= PER_PEER:
            victim = self._stalled(now, conn.peer)
            if victim is None:
                return False
            self._evict(victim)
        conn.answering, conn.progress = True, now
        return True

    async def _serve(self, conn: Connection) -> None:
        finished = False
        try:
            try:
                head = await asyncio.wait_for(self._read_head(conn.sock), HEAD_TIMEOUT)
                method, path, headers = parse_head(head)
            except (asyncio.TimeoutError, ValueError):
                answer = response(400, b"not an HTTP/1.x request\n")
            else:
                if self._may_answer(conn):
                    answer = await self._answer(method, path, headers)
                else:
                    answer = response(503, f"more than {PER_PEER} answers at once to one address\n".encode())
            await asyncio.wait_for(self._send(conn, answer), WRITE_TIMEOUT)
            finished = True
        except (OSError, asyncio.TimeoutError):
            pass  # the client went away, or does not read: nothing to tell it
        finally:
            if finished:
                conn.sock.close()
            else:
                abort(conn.sock)

    @staticmethod
    async def _read_head(sock: socket.socket) -> bytes:
        """The request line and headers, read into one buffer of :data:`MAX_HEAD` bytes
        (ValueError: the connection ended first, or the buffer is full without their end).
        Nothing past the blank line is read, and no read allocates more than that buffer."""
        loop = asyncio.get_running_loop()
        buffer = bytearray(MAX_HEAD)
        view = memoryview(buffer)
        filled = 0
        while filled < MAX_HEAD:
            n = await loop.sock_recv_into(sock, view[filled:])
            if n == 0:
                raise ValueError("the request ended before its blank line")
            end = buffer.find(b"\r\n\r\n", max(0, filled - 3), filled + n)
            filled += n
            if end >= 0:
                return bytes(buffer[:end + 4])
        raise ValueError(f"a request head of more than {MAX_HEAD} bytes")

    @staticmethod
    async def _send(conn: Connection, answer: Answer) -> None:
        """The answer, :data:`CHUNK` bytes at a time as the client takes them (the kernel
        holds at most the socket's small send buffer of it), then until the client has
        received it all: closing earlier would leave the rest in an orphaned socket."""
        loop = asyncio.get_running_loop()
        for part in answer:
            view = memoryview(part)
            for offset in range(0, len(view), CHUNK):
                await loop.sock_sendall(conn.sock, view[offset:offset + CHUNK])
                conn.progress = time.monotonic()
        delay, left = 0.001, unsent(conn.sock)
        while left > 0:
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.05)
            now_left = unsent(conn.sock)
            if now_left < left:
                conn.progress = time.monotonic()
            left = now_left

    async def _answer(self, method: str, path: str, headers: dict[str, str]) -> Answer:
        if method not in ("GET", "HEAD"):
            return response(405, b"only GET and HEAD\n")
        head = method == "HEAD"
        if path == "/":
            return response(200, b"memagent: the metrics are at /metrics\n", head=head)
        if path != "/metrics":
            return response(404, b"not found: the metrics are at /metrics\n", head=head)
        openmetrics = wants_openmetrics(headers.get("accept", ""))
        body = await self.body(openmetrics)
        from .exposition import OPENMETRICS_TYPE, TEXT_TYPE

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
        tasks: list[asyncio.Future[Any]] = [*self._acceptors, *self._connections]
        tasks += [future for _, future in self._bodies.values()]
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
        for sock in self.listeners:
            sock.close()
        self.listeners, self._acceptors = [], []
