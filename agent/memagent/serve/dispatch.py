"""Requests in, replies out: what each request frame does to the agent's state.

Kept apart from the socket code so that the rules (who may touch which process, what a
reply holds) read in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TypeVar

from memproto import ListFrameEncoder
from memproto.frames import (
    Ack,
    Attach,
    AttachOk,
    Detach,
    DetachOk,
    Error,
    Frame,
    History,
    HistoryOk,
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
from memproto.limits import MAX_FRAME_BYTES
from memproto.records import DaemonStatus, Failure, ProcessInfo, ProcessRef, Series
from memproto.text import label_problem
from memproto.vocabulary import ErrorCode, StackState

from ..core.groups import KINDS, GroupRule, Groups
from ..core.pacing import Pacer, Slice
from ..core.registry import Registry
from ..core.stack_collector import StackCollector
from ..core.watched import Watched
from ..errors import AccessDenied, CannotRead, MemagentError, NoSuchProcess, ProcessError
from .access import Access
from .session import ClientSession

log = logging.getLogger(__name__)


T = TypeVar("T")
Handler = Callable[["ClientSession", Frame], Awaitable[Frame | bytes | None]]
#: Fresh stack dumps one client may wait for at once.
MAX_DEFERRED_STACKS = 4


class InvalidPid(ProcessError):
    code = ErrorCode.INVALID

    def __init__(self, pid: int) -> None:
        super().__init__(pid, f"invalid pid: {pid}")


class NotWatched(ProcessError):
    """``detach`` of a process that exists but that the caller sees no watched entry of."""

    code = ErrorCode.NO_SUCH_PROCESS

    def __init__(self, pid: int) -> None:
        super().__init__(pid, f"not watched: {pid}")


async def _each_pid(pids: list[int], act: Callable[[int], list[T]], pace: Slice) -> tuple[list[T], list[Failure]]:
    """``act`` on each PID of a request (each once, in order): what it gave, and a Failure
    for each PID it refused (no such process, permission denied, invalid, or the agent out
    of descriptors). The tick runs in between when it is due (:mod:`.pacing`)."""
    done: list[T] = []
    failed: list[Failure] = []
    for pid in dict.fromkeys(pids):
        try:
            done.extend(act(pid))
        except MemagentError as exc:
            failed.append(Failure(pid, exc.code, str(exc)))
        await pace.pause()
    return done, failed


async def _encode_list(tag: str, fixed: dict[str, object], field: str, items: Iterable[object], count: int,
                       pace: Slice, request_id: int) -> bytes | Error:
    """A reply whose last field is a long list of ``count`` items, packed item by item
    between ticks (``items`` may make each one only when it is packed); an error frame
    instead when it would pass the frame limit (found before it is all built)."""
    encoder = ListFrameEncoder(tag, fixed, field, count)
    for item in items:
        encoder.add(item)
        if encoder.size > MAX_FRAME_BYTES:
            return Error(request_id, ErrorCode.TOO_LARGE, f"reply over {MAX_FRAME_BYTES} bytes; ask for less")
        await pace.pause()
    return encoder.bytes()


GROUP_MISUSE = "at most one of cgroup, unit, container, not empty"


def _group(cgroup: str | None, unit: str | None, container: str | None) -> list[tuple[str, str]] | None:
    """The group an ``attach`` or ``detach`` names, as ``[(kind, value)]`` (empty: none);
    None when it names more than one or an empty one."""
    given = [(kind, v) for kind, v in zip(KINDS, (cgroup, unit, container), strict=True) if v is not None]
    return None if len(given) > 1 or any(not v for _, v in given) else given


def _memory_reader(w: Watched) -> int | None:
    """The unprivileged UID that may read ``w``'s memory, re-read while it runs (it may
    change its UIDs or dumpability); an exited process keeps the last word."""
    if w.alive:
        with contextlib.suppress(MemagentError):  # gone meanwhile: the last word stands
            w.memory_reader = w.handle.memory_access().reader
    return w.memory_reader


class Dispatcher:
    """Each request type's handler, over what requests act on: the registry, the stack
    collector, and the daemon's status (built by the caller, who owns the other parts).

    Handlers are coroutines: the long ones (many PIDs, many processes) give the tick its
    turn between units of work through ``pacer`` (:mod:`.pacing`)."""

    def __init__(self, registry: Registry, stacks: StackCollector, status: Callable[[Access], DaemonStatus],
                 pacer: Pacer | None = None, groups: Groups | None = None) -> None:
        self.registry = registry
        #: The attach-by-group rules the scan applies to later processes (memagent.core.groups).
        self.groups = groups or Groups(registry)
        self.stacks = stacks
        self.status_of = status
        self.pacer = pacer or Pacer()
        self._handlers: dict[type[Frame], Handler] = {
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

    async def handle(self, session: ClientSession, request: Frame) -> Frame | bytes | None:
        """The reply: a frame, an already encoded payload (large replies), or None when
        the handler sends it later itself (a fresh stack dump)."""
        handler = self._handlers.get(type(request))
        if handler is None:
            return Error(getattr(request, "id", None), ErrorCode.UNKNOWN_REQUEST, f"{request.TYPE!r} is not a request")
        return await handler(session, request)

    async def attach(self, session: ClientSession, req: Attach) -> AttachOk | Error | bytes:
        if req.label is not None and (problem := label_problem(req.label)) is not None:
            return Error(req.id, ErrorCode.INVALID, f"label: {problem}")
        may_watch = session.access.may_watch
        # A label from a client that does not see everything names its own processes only:
        # the operator's budgets (config) count only labels root, admins or the config set.
        trusted = session.access.sees_all

        def one(pid: int) -> list[Watched]:
            if pid <= 0:
                raise InvalidPid(pid)
            watched = self.registry.attach(pid, label=req.label, children=req.children, may_watch=may_watch)
            for w in watched:
                if req.label is not None:
                    w.label_trusted = trusted
                self.registry.oom.judge(w)  # its label's oom_score_adj, in the reply already
            return watched

        selected = _group(req.cgroup, req.unit, req.container)
        if selected is None:
            return Error(req.id, ErrorCode.INVALID, GROUP_MISUSE)
        pace = self.pacer.start()
        if req.container and req.pids:  # PIDs as the container sees them: those only, no rule
            members = await self._members("container", req.container)

            def inside(pid: int) -> list[Watched]:
                host = self.groups.host_pid(members, pid)
                if host is None:
                    raise NoSuchProcess(pid, f"no PID {pid} in container {req.container}")
                return one(host)

            attached, failed = await _each_pid(req.pids, inside, pace)
            return AttachOk(req.id, [w.info() for w in attached], failed)
        rule = GroupRule(*selected[0], req.label, trusted, may_watch,
                         None if trusted else session.access.peer.uid) if selected else None
        # A rule past its owner's share (or all users'): the whole request refused, nothing
        # attached, before any PID is looked at (docs/security.md "Attach rules without end").
        if rule is not None and (refused := self.groups.refusal(rule)) is not None:
            return Error(req.id, ErrorCode.BUSY, f"group rule refused: {refused}")
        attached, failed = await _each_pid(req.pids, one, pace)
        if rule is not None:
            attached += await self._attach_group(rule.kind, rule.value, one, pace, rule)
        infos = [w.info() for w in attached]
        if len(infos) < 200:
            return AttachOk(req.id, infos, failed)
        return await _encode_list(AttachOk.TYPE, {"id": req.id, "failed": failed}, "attached", infos, len(infos),
                                  pace, req.id)

    async def _attach_group(self, kind: str, value: str, one: Callable[[int], list[Watched]], pace: Slice,
                            rule: GroupRule) -> list[Watched]:
        """Every process in the group now (read in a thread: a /proc file per process, and
        the containers' names), each the caller may watch; and the rule for later ones,
        kept first so that none starts unseen in between."""
        self.groups.add(rule)
        found: list[Watched] = []
        for pid in await self._members(kind, value):
            try:
                found += one(pid)
            except MemagentError as exc:  # not the caller's, a kernel thread, or gone: not a failure
                log.debug("attach %s %s: %d skipped: %s", kind, value, pid, exc)
            await pace.pause()
        return found

    async def _members(self, kind: str, value: str) -> list[int]:
        """The processes in the group now, found in a thread (a /proc file per process, and
        for a container the names of the box's containers first)."""
        everyone = self.registry.procfs.pids()
        if kind == "container":
            names = self.registry.container_names
            await asyncio.to_thread(lambda: names.resolve(self.groups.identities(everyone)))
        return await asyncio.to_thread(self.groups.members, kind, value, everyone)

    async def detach(self, session: ClientSession, req: Detach) -> DetachOk | Error:
        may_watch = session.access.may_watch

        def one(pid: int) -> list[ProcessRef]:
            try:
                return [w.ref() for w in self.registry.detach(pid, may_watch)]
            except NoSuchProcess:
                pass
            # Nothing to detach: say which, "no such process" (no process has that PID) or
            # "not watched" (one lives, watched by nobody, or by no one this caller may see).
            with contextlib.suppress(AccessDenied, CannotRead):  # those say it exists
                self.registry.procfs.stat(pid)  # NoSuchProcess(pid): "no such process: N"
            raise NotWatched(pid)

        given = _group(req.cgroup, req.unit, req.container)
        if given is None:
            return Error(req.id, ErrorCode.INVALID, GROUP_MISUSE)
        pace = self.pacer.start()
        detached, failed = await _each_pid(req.pids, one, pace)
        ended = 0
        if given:  # the group's rule (the caller's own; any, for one that sees all) and its members now
            access = session.access
            ended = self.groups.remove(*given[0], lambda r: access.sees_all or r.owner == access.peer.uid)
            members = set(await self._members(*given[0]))
            for w in [w for w in self.registry.alive if w.pid in members and may_watch(w.uid)]:
                detached.extend(x.ref() for x in self.registry.detach(w.pid, may_watch))
                await pace.pause()
        if req.exited:
            detached.extend(w.ref() for w in self.registry.detach_exited(may_watch))
        return DetachOk(req.id, detached, failed, ended)

    async def reset_peaks(self, session: ClientSession, req: ResetPeaks) -> ResetPeaksOk:
        may_watch = session.access.may_watch

        def one(pid: int) -> list[ProcessInfo]:
            if req.kernel:
                self._kernel_reset_check(session.access, pid)
            return [self.registry.reset_peaks(pid, may_watch, kernel=req.kernel).info()]

        reset, failed = await _each_pid(req.pids, one, self.pacer.start())
        return ResetPeaksOk(req.id, reset, failed)

    def _kernel_reset_check(self, access: Access, pid: int) -> None:
        """A kernel reset (clear_refs) also resets what the process reports about itself
        (``getrusage().ru_maxrss``): never for PID 1, and for any client, root included,
        only for a process it could reset itself: real, effective and saved UID the
        client's, and dumpable (its /proc files the client's). Re-read now."""
        w = self.registry.live(pid, access.may_watch)  # not visible: "not watched" as without kernel
        if pid == 1:
            raise AccessDenied(pid, "kernel: resetting the kernel's mark resets the process's own ru_maxrss; "
                                    "never for PID 1")
        if _memory_reader(w) != access.peer.uid:
            raise AccessDenied(pid, "kernel: resetting the kernel's mark resets the process's own ru_maxrss; "
                                    "only for a process of yours (real, effective and saved UID yours, dumpable)")

    def _visible(self, session: ClientSession) -> list[Watched]:
        return self.registry.visible(session.access.may_watch)

    async def list(self, session: ClientSession, req: ListProcesses) -> bytes | Error:
        """Encoded record by record: 1000 processes cost ~30 ms, cut into slices."""
        visible = self._visible(session)
        return await _encode_list(ListOk.TYPE, {"id": req.id}, "processes", (w.info() for w in visible),
                                  len(visible), self.pacer.start(), req.id)

    async def subscribe(self, session: ClientSession, req: Subscribe) -> Ack:
        session.subscribed = True
        return Ack(req.id)

    async def unsubscribe(self, session: ClientSession, req: Unsubscribe) -> Ack:
        session.subscribed = False
        return Ack(req.id)

    async def history(self, session: ClientSession, req: History) -> bytes | Error:
        """Encoded series by series, between ticks (see :class:`memproto.ListFrameEncoder`):
        each process's values exist as Python ints only while its series is packed (1000 x
        600 of them at once would cost the daemon ~20 MB). ``seconds`` that is not a finite
        number (msgpack carries ``inf`` and ``nan``) is the client's mistake: ``invalid``,
        never a slot count that cannot be computed."""
        if req.seconds is not None and not math.isfinite(req.seconds):
            return Error(req.id, ErrorCode.INVALID,
                         f"history.seconds: expected a finite number or nil, got {req.seconds}")
        wanted = set(req.pids)
        chosen = [w for w in self._visible(session) if not wanted or w.pid in wanted]

        def series() -> Iterator[Series]:
            for w in chosen:
                end, values = w.history.series(req.seconds)
                yield Series(w.pid, w.start_time, end, values)

        return await _encode_list(HistoryOk.TYPE, {"id": req.id, "step": self.registry.history_step}, "series",
                                  series(), len(chosen), self.pacer.start(), req.id)

    async def stack(self, session: ClientSession, req: Stack) -> Frame | None:
        candidates = [w for w in self.registry.find(req.pid) if session.access.may_watch(w.uid)]
        if not candidates:
            return Error(req.id, ErrorCode.NO_SUCH_PROCESS, f"no such process: {req.pid} (not watched)")
        w = max(candidates, key=lambda c: (c.alive, c.start_time))
        refusal = self._stack_refusal(session.access, w)
        if refusal is not None:
            return Error(req.id, ErrorCode.PERMISSION_DENIED, refusal)
        if not (req.fresh and w.alive):
            return self._stack_ok(req, w)
        if session.deferred >= MAX_DEFERRED_STACKS:
            return Error(req.id, ErrorCode.BUSY, f"{MAX_DEFERRED_STACKS} stack requests of yours are in flight")
        session.deferred += 1

        async def reply_when_taken() -> None:
            try:
                await self.stacks.demand(w)
                reply: Frame = self._stack_ok(req, w)
            except MemagentError as exc:
                log.exception("stack %d failed", req.pid)
                reply = Error(req.id, ErrorCode.INTERNAL, f"stack failed: {type(exc).__name__}: {exc}")
            finally:
                session.deferred -= 1
            session.send(reply)

        task = asyncio.ensure_future(reply_when_taken())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return None

    @staticmethod
    def _stack_refusal(access: Access, w: Watched) -> str | None:
        """A process's stack is its memory: a client that does not see everything gets it
        only where its own py-spy could read it: real, effective and saved UID its own, and
        the process dumpable (not setuid, no ``PR_SET_DUMPABLE 0``). Re-read at each request
        while the process runs (it may change both); an exited process keeps the last word."""
        if access.sees_all:
            return None
        if _memory_reader(w) != access.peer.uid:
            return (f"permission denied: {w.pid} (setuid, changed UIDs or not dumpable: "
                    "its memory is not readable by you)")
        return None

    def _stack_ok(self, req: Stack, w: Watched) -> StackOk:
        collector = self.stacks
        ps = collector.stacks.get(w.key)
        if ps is None:
            state = StackState.DISABLED if not collector.config.enabled else w.stack_state or StackState.PENDING
            return StackOk(req.id, w.pid, w.start_time, state, None, None, None, [], [])
        by_line, by_function = ps.sites()
        return StackOk(req.id, w.pid, w.start_time, ps.state or StackState.PENDING, ps.message, ps.latest,
                       ps.at_peak, by_line, by_function, ps.at_peak_state)

    async def status(self, session: ClientSession, req: Status) -> StatusOk:
        return StatusOk(req.id, self.status_of(session.access))
