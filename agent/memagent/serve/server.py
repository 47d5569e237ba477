"""The Unix-socket server: accepts clients, handshakes, routes requests, fans out frames.

The listening socket itself (its directory, mode and group) is :mod:`memagent.serve.listen`'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from memproto import (
    PROTOCOL_MAJOR,
    PROTOCOL_VERSION,
    IncompatibleVersion,
    ProtocolError,
    UnknownFrameType,
    decode_body,
    encode,
    encode_sample,
    frame_bytes,
    unpack,
)
from memproto.frames import AlertRaised, Attached, Detached, Error, Exited, Frame, Hello, StackStateChanged
from memproto.limits import MAX_CLIENT_FRAME_BYTES
from memproto.records import Alert
from memproto.vocabulary import ErrorCode

from .. import SOFTWARE
from ..config import RESERVED_FOR_ADMINS
from ..core.registry import Registry
from ..core.watched import Watched
from ..errors import MemagentError
from .access import AccessPolicy, alert_for, own_pids, peer_credentials
from .listen import DaemonLock, bind_socket, lock_daemon, remove_socket
from .session import ClientSession

log = logging.getLogger(__name__)

HELLO_TIMEOUT = 10.0

RequestHandler = Callable[[ClientSession, Frame], Awaitable[Frame | bytes | None]]


class Server:
    """Owns the listening socket and the sessions; is the registry's event sink."""

    def __init__(
        self,
        path: str,
        *,
        policy: AccessPolicy,
        handle_request: RequestHandler,
        interval: float,
        socket_gid: int | None = None,
        max_clients: int,
        max_clients_per_uid: int,
        idle_timeout: float,
    ) -> None:
        self.path = path
        self.policy = policy
        self.handle_request = handle_request
        self.interval = interval
        self.socket_gid = socket_gid
        self.max_clients = max_clients
        self.max_clients_per_uid = max_clients_per_uid
        self.idle_timeout = idle_timeout
        self.sessions: set[ClientSession] = set()
        self._server: asyncio.base_events.Server | None = None
        self._inode: int | None = None
        self._lock: DaemonLock | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._dropped_by_gone = 0

    def apply(self, policy: AccessPolicy, *, max_clients: int, max_clients_per_uid: int,
              idle_timeout: float) -> None:
        """A reload: the access policy for new connections (a client's access is decided
        once, at connect) and the connection limits; the socket stays bound."""
        self.policy = policy
        self.max_clients, self.max_clients_per_uid, self.idle_timeout = max_clients, max_clients_per_uid, idle_timeout

    @property
    def dropped_samples(self) -> int:
        """Sample frames dropped for slow clients since start, all clients together."""
        return self._dropped_by_gone + sum(s.dropped for s in self.sessions)

    async def start(self) -> None:
        # The lock first: one daemon per path, even after its socket file was deleted.
        self._lock = lock_daemon(self.path, self.socket_gid)
        try:
            sock, self._inode = bind_socket(self.path, self.socket_gid)
        except BaseException:
            self._lock.release()
            raise
        self._server = await asyncio.start_unix_server(self._on_connect, sock=sock)
        log.info("listening on %s", self.path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for session in list(self.sessions):
            session.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        remove_socket(self.path, self._inode)
        if self._lock is not None:
            self._lock.release()

    # ------------------------------------------------------------------ sessions

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            sock = writer.get_extra_info("socket")
            access = self.policy.access(peer_credentials(sock))
            session = ClientSession(reader, writer, access)
            refusal = self._refusal(session)
            if refusal is not None:
                log.warning("%s refused: %s", session.name, refusal)
                session.close_with(Error(None, ErrorCode.BUSY, refusal))
                await session.write_loop()
                return
            self.sessions.add(session)
            log.debug("%s connected", session.name)
            session.send(Hello(list(PROTOCOL_VERSION), "server", SOFTWARE, self.interval, os.getpid()))
            writer_task = asyncio.ensure_future(session.write_loop())
            worker = asyncio.ensure_future(self._serve_requests(session))
            hello_timer = asyncio.get_running_loop().call_later(HELLO_TIMEOUT, self._hello_timeout, session)
            try:
                await session.read_loop(MAX_CLIENT_FRAME_BYTES, lambda p: self._on_payload(session, p))
            finally:
                hello_timer.cancel()
                worker.cancel()
                await asyncio.gather(worker, return_exceptions=True)
                await writer_task
                self.sessions.discard(session)
                self._dropped_by_gone += session.dropped
                log.debug("%s disconnected", session.name)
        except asyncio.CancelledError:
            # Only :meth:`close` cancels a session (the daemon stops): end quietly. asyncio's
            # stream server would log a cancelled connection task as an error.
            pass
        finally:
            if task is not None:
                self._tasks.discard(task)

    def _refusal(self, session: ClientSession) -> str | None:
        """Why this client may not connect now, or None. Root and admins are refused only
        when every slot is taken; others also past their UID's share, or when only the
        slots kept for admins are left."""
        if len(self.sessions) >= self.max_clients:
            return f"too many clients ({self.max_clients})"
        if session.access.sees_all:
            return None
        if len(self.sessions) >= self.max_clients - RESERVED_FOR_ADMINS:
            return f"too many clients ({len(self.sessions)}); the last {RESERVED_FOR_ADMINS} slots are for root"
        uid = session.access.peer.uid
        mine = sum(1 for s in self.sessions if not s.access.sees_all and s.access.peer.uid == uid)
        if mine >= self.max_clients_per_uid:
            return f"too many connections from uid {uid} ({self.max_clients_per_uid})"
        return None

    async def _serve_requests(self, session: ClientSession) -> None:
        """A client's requests, one at a time: the next is read off its queue only once
        the last reply has been written out (one reply at most waits for a slow reader).
        A client neither subscribed nor asking anything for ``idle_timeout`` is closed."""
        while not session.closing:
            try:
                request_id, frame = await asyncio.wait_for(session.requests.get(), self.idle_timeout)
            except asyncio.TimeoutError:
                if session.greeted and not session.subscribed and session.deferred == 0:
                    log.info("%s idle for %g s: closing", session.name, self.idle_timeout)
                    session.close_with(Error(None, ErrorCode.IDLE, f"no request for {self.idle_timeout:g} s"))
                    return
                continue
            await session.wait_flushed()
            reply: Frame | bytes | None
            try:
                reply = await self.handle_request(session, frame)
            except MemagentError as exc:
                # An unexpected /proc state must cost this request, not the session.
                log.exception("%s: %s failed", session.name, frame.TYPE)
                reply = Error(request_id, ErrorCode.INTERNAL, f"{frame.TYPE} failed: {type(exc).__name__}: {exc}")
            if reply is not None:  # None: the handler replies later (a stack dump in flight)
                session.send(reply, request_id)

    def _hello_timeout(self, session: ClientSession) -> None:
        if not session.greeted:
            session.close_with(Error(None, ErrorCode.PROTOCOL, f"no hello within {HELLO_TIMEOUT:g} s"))

    async def _on_payload(self, session: ClientSession, payload: bytes) -> None:
        try:
            body = unpack(payload, request=True)
        except ProtocolError as exc:
            log.info("%s: %s", session.name, exc)
            session.close_with(Error(None, exc.code, str(exc)))
            return
        request_id = body.get("id") if type(body) is dict else None
        request_id = request_id if type(request_id) is int else None
        try:
            frame = decode_body(body)
        except IncompatibleVersion as exc:
            session.close_with(Error(None, exc.code, f"client speaks protocol v{exc.theirs}, "
                                     f"this daemon speaks v{exc.ours}"))
            return
        except UnknownFrameType as exc:
            if not session.greeted:
                session.close_with(Error(None, ErrorCode.PROTOCOL, f"expected hello first, got {exc.type_tag!r}"))
            else:
                session.send(Error(request_id, ErrorCode.UNKNOWN_REQUEST, str(exc)))
            return
        except ProtocolError as exc:
            if not session.greeted:
                session.close_with(Error(None, exc.code, str(exc)))
            else:
                session.send(Error(request_id, ErrorCode.INVALID, str(exc)))
            return
        if not session.greeted:
            self._greet(session, frame)
            return
        if isinstance(frame, Hello):
            session.send(Error(None, ErrorCode.PROTOCOL, "hello sent twice"))
            return
        await session.requests.put((request_id, frame))  # full: the socket is not read meanwhile

    def _greet(self, session: ClientSession, frame: Frame) -> None:
        if not isinstance(frame, Hello) or frame.role != "client":
            session.close_with(Error(None, ErrorCode.PROTOCOL, f"expected a client hello first, got {frame.TYPE!r}"))
        elif frame.version[0] != PROTOCOL_MAJOR:
            session.close_with(Error(None, ErrorCode.VERSION, f"client speaks protocol v{frame.version[0]}, "
                                     f"this daemon speaks v{PROTOCOL_MAJOR}"))
        else:
            session.greeted = True

    # ------------------------------------------------------------------ fan-out

    def _subscribers(self) -> list[ClientSession]:
        return [s for s in self.sessions if s.subscribed]

    def broadcast_sample(self, seq: int, now: float, rows: list[tuple[object, ...]], uids: list[int]) -> None:
        """Encode the tick's frame once per distinct view (all, or one UID's) and queue it."""
        encoded: dict[int | None, bytes] = {}
        for session in self._subscribers():
            view = None if session.access.sees_all else session.access.peer.uid
            framed = encoded.get(view)
            if framed is None:
                mine = rows if view is None else [r for r, u in zip(rows, uids, strict=True) if u == view]
                framed = encoded[view] = frame_bytes(encode_sample(seq, now, self.interval, mine))
            session.send_sample(framed)

    def _publish(self, frame: Frame, uid: int) -> None:
        framed: bytes | None = None
        for session in self._subscribers():
            if session.access.may_watch(uid):
                framed = framed or frame_bytes(encode(frame))
                session.send_event(framed)

    def attached(self, w: Watched) -> None:
        self._publish(Attached(w.info()), w.uid)

    def exited(self, w: Watched) -> None:
        self._publish(Exited(w.pid, w.start_time, w.exited_at or 0.0, w.peak), w.uid)

    def detached(self, w: Watched) -> None:
        self._publish(Detached(w.pid, w.start_time), w.uid)

    def publish_alert(self, alert: Alert, registry: Registry) -> None:
        own_by_uid: dict[int | None, set[int] | None] = {}
        for session in self._subscribers():
            view = None if session.access.sees_all else session.access.peer.uid
            if view not in own_by_uid:
                own_by_uid[view] = own_pids(session.access, registry)
            visible = alert_for(alert, own_by_uid[view])
            if visible is not None:
                session.send(AlertRaised(visible))

    def stack_state(self, w: Watched, message: str | None) -> None:
        self._publish(StackStateChanged(w.pid, w.start_time, w.stack_state or "", message), w.uid)
