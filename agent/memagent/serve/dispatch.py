"""Requests in, replies out: what each request frame does to the agent's state.

Kept apart from the socket code so that the rules (who may touch which process, what a
reply holds) read in one place.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import TypeVar

from memproto import encode_history_ok
from memproto.frames import (
    Ack,
    Attach,
    AttachOk,
    Detach,
    DetachOk,
    Error,
    Frame,
    History,
    ListOk,
    ListProcesses,
    ResetPeaks,
    ResetPeaksOk,
    Stack,
    StackOk,
    Status,
    StatusOk,
    Subscribe,
    Unsubscribe,
)
from memproto.records import DaemonStatus, Failure, ProcessInfo, Series
from memproto.vocabulary import ErrorCode, StackState

from ..core.registry import Registry
from ..core.stack_collector import StackCollector
from ..core.watched import Watched
from ..errors import MemagentError, ProcessError
from .access import Access
from .session import ClientSession

log = logging.getLogger(__name__)


T = TypeVar("T")


class InvalidPid(ProcessError):
    code = ErrorCode.INVALID

    def __init__(self, pid: int) -> None:
        super().__init__(pid, f"invalid pid: {pid}")


def _each_pid(pids: list[int], act: Callable[[int], list[T]]) -> tuple[list[T], list[Failure]]:
    """``act`` on each PID of a request: what it gave, and a Failure for each PID it
    refused (no such process, permission denied, invalid, or the agent out of descriptors)."""
    done: list[T] = []
    failed: list[Failure] = []
    for pid in pids:
        try:
            done.extend(act(pid))
        except MemagentError as exc:
            failed.append(Failure(pid, exc.code, str(exc)))
    return done, failed


class Dispatcher:
    """Each request type's handler, over what requests act on: the registry, the stack
    collector, and the daemon's status (built by the caller, who owns the other parts)."""

    def __init__(self, registry: Registry, stacks: StackCollector, status: Callable[[Access], DaemonStatus]) -> None:
        self.registry = registry
        self.stacks = stacks
        self.status_of = status
        self._handlers: dict[type[Frame], Callable[[ClientSession, Frame], Frame | bytes | None]] = {
            Attach: self.attach,  # type: ignore[dict-item]
            Detach: self.detach,  # type: ignore[dict-item]
            ResetPeaks: self.reset_peaks,  # type: ignore[dict-item]
            ListProcesses: self.list,  # type: ignore[dict-item]
            Subscribe: self.subscribe,  # type: ignore[dict-item]
            Unsubscribe: self.unsubscribe,  # type: ignore[dict-item]
            History: self.history,  # type: ignore[dict-item]
            Status: self.status,  # type: ignore[dict-item]
            Stack: self.stack,  # type: ignore[dict-item]
        }
        self._pending: set[asyncio.Task[None]] = set()

    def handle(self, session: ClientSession, request: Frame) -> Frame | bytes | None:
        """The reply: a frame, an already encoded payload (large replies), or None when
        the handler sends it later itself (a fresh stack dump)."""
        handler = self._handlers.get(type(request))
        if handler is None:
            return Error(getattr(request, "id", None), ErrorCode.UNKNOWN_REQUEST, f"{request.TYPE!r} is not a request")
        return handler(session, request)

    def attach(self, session: ClientSession, req: Attach) -> AttachOk:
        may_watch = session.access.may_watch

        def one(pid: int) -> list[ProcessInfo]:
            if pid <= 0:
                raise InvalidPid(pid)
            watched = self.registry.attach(pid, label=req.label, children=req.children, may_watch=may_watch)
            return [w.info() for w in watched]

        attached, failed = _each_pid(req.pids, one)
        return AttachOk(req.id, attached, failed)

    def detach(self, session: ClientSession, req: Detach) -> DetachOk:
        may_watch = session.access.may_watch
        detached, failed = _each_pid(req.pids, lambda pid: [w.ref() for w in self.registry.detach(pid, may_watch)])
        if req.exited:
            detached.extend(w.ref() for w in self.registry.detach_exited(may_watch))
        return DetachOk(req.id, detached, failed)

    def reset_peaks(self, session: ClientSession, req: ResetPeaks) -> ResetPeaksOk:
        may_watch = session.access.may_watch
        reset, failed = _each_pid(req.pids, lambda pid: [self.registry.reset_peaks(pid, may_watch).info()])
        return ResetPeaksOk(req.id, reset, failed)

    def _visible(self, session: ClientSession) -> list[Watched]:
        return self.registry.visible(session.access.may_watch)

    def list(self, session: ClientSession, req: ListProcesses) -> ListOk:
        return ListOk(req.id, [w.info() for w in self._visible(session)])

    def subscribe(self, session: ClientSession, req: Subscribe) -> Ack:
        session.subscribed = True
        return Ack(req.id)

    def unsubscribe(self, session: ClientSession, req: Unsubscribe) -> Ack:
        session.subscribed = False
        return Ack(req.id)

    def history(self, session: ClientSession, req: History) -> bytes:
        """Encoded series by series (see :func:`memproto.encode_history_ok`)."""
        wanted = set(req.pids)
        chosen = [w for w in self._visible(session) if not wanted or w.pid in wanted]

        def series() -> Iterator[Series]:
            for w in chosen:
                end, values = w.history.series(req.seconds)
                yield Series(w.pid, w.start_time, end, values)

        return encode_history_ok(req.id, self.registry.history_step, series(), len(chosen))

    def stack(self, session: ClientSession, req: Stack) -> Frame | None:
        candidates = [w for w in self.registry.find(req.pid) if session.access.may_watch(w.uid)]
        if not candidates:
            return Error(req.id, ErrorCode.NO_SUCH_PROCESS, f"no such process: {req.pid} (not watched)")
        w = max(candidates, key=lambda c: (c.alive, c.start_time))
        if not (req.fresh and w.alive):
            return self._stack_ok(req, w)

        async def reply_when_taken() -> None:
            try:
                await self.stacks.demand(w)
                reply: Frame = self._stack_ok(req, w)
            except MemagentError as exc:
                log.exception("stack %d failed", req.pid)
                reply = Error(req.id, ErrorCode.INTERNAL, f"stack failed: {type(exc).__name__}: {exc}")
            session.send(reply)

        task = asyncio.ensure_future(reply_when_taken())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return None

    def _stack_ok(self, req: Stack, w: Watched) -> StackOk:
        collector = self.stacks
        ps = collector.stacks.get(w.key)
        if ps is None:
            state = StackState.DISABLED if not collector.config.enabled else w.stack_state or StackState.PENDING
            return StackOk(req.id, w.pid, w.start_time, state, None, None, None, [], [])
        by_line, by_function = ps.sites()
        return StackOk(req.id, w.pid, w.start_time, ps.state or StackState.PENDING, ps.message, ps.latest,
                       ps.at_peak, by_line, by_function)

    def status(self, session: ClientSession, req: Status) -> StatusOk:
        return StatusOk(req.id, self.status_of(session.access))
