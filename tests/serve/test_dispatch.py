"""Request handling (:class:`Dispatcher`) over a registry on a fixture /proc tree: each
request's reply, invalid PIDs, and what a client that is not an admin may see and touch."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import pytest
from proctree import TRAINER, WEIRD, ZOMBIE, MiB, ProcTree

from memagent.config import StackConfig
from memagent.core.registry import Registry
from memagent.core.stack_collector import StackCollector
from memagent.serve.access import Access, Peer
from memagent.serve.dispatch import Dispatcher
from memproto import decode
from memproto.frames import (
    Ack,
    Attach,
    AttachOk,
    Detach,
    DetachOk,
    Error,
    Frame,
    Hello,
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
from memproto.records import DaemonStatus, Failure, HostMemory, ProcessRef, Series, TickStats
from memproto.vocabulary import ErrorCode, StackState

#: Owner of TRAINER and ZOMBIE; WEIRD belongs to uid 1001.
USER = Access(Peer(pid=7001, uid=1000, gid=1000, groups=frozenset()), sees_all=False)
ADMIN = Access(Peer(pid=7002, uid=0, gid=0, groups=frozenset()), sees_all=True)
#: ``dispatch(access, request)``: the reply to ``request`` from a client with ``access``.
Dispatch = Callable[[Access, Frame], Any]


class Session:
    """What the dispatcher uses of a client session: who it is, its subscription, send()."""

    def __init__(self, access: Access) -> None:
        self.access = access
        self.subscribed = False
        self.sent: list[Frame | bytes] = []
        self.got = asyncio.Event()
        self.deferred = 0

    def send(self, frame: Frame | bytes, request_id: int | None = None) -> None:
        self.sent.append(frame)
        self.got.set()


def daemon_status(access: Access) -> DaemonStatus:
    return DaemonStatus("memagent test", 1, 0, 1.0, 0.5, "/tmp/s.sock", 0, 0, 1, TickStats(0, 0.0, 0.0, 0, 0.0),
                        HostMemory(0, 0, 0, 0), dropped_samples=access.peer.uid)


@pytest.fixture
def dispatch(registry: Registry) -> Dispatch:
    dispatcher = Dispatcher(registry, StackCollector(StackConfig(enabled=False)), daemon_status)

    def run(access: Access, request: Frame) -> Any:
        """The reply, decoded when it comes encoded (lists and histories are packed record by record)."""
        reply = asyncio.run(dispatcher.handle(Session(access), request))  # type: ignore[arg-type]
        return decode(reply) if isinstance(reply, bytes) else reply

    return run


def not_watched(pid: int) -> Failure:
    return Failure(pid, ErrorCode.NO_SUCH_PROCESS, f"no such process: {pid} (not watched)")


def test_attach_replies_with_the_attached_and_the_failed(dispatch: Dispatch) -> None:
    reply = dispatch(USER, Attach(id=1, pids=[TRAINER, 0, -3, 999999], label="run"))
    assert isinstance(reply, AttachOk) and reply.id == 1
    assert [(p.pid, p.label, p.uid, p.alive) for p in reply.attached] == [(TRAINER, "run", 1000, True)]
    assert reply.failed == [
        Failure(0, ErrorCode.INVALID, "invalid pid: 0"), Failure(-3, ErrorCode.INVALID, "invalid pid: -3"),
        Failure(999999, ErrorCode.NO_SUCH_PROCESS, "no such process: 999999"),
    ]


def test_attach_with_children_takes_only_the_callers_own(dispatch: Dispatch) -> None:
    reply = dispatch(USER, Attach(id=1, pids=[TRAINER], children=True))
    assert isinstance(reply, AttachOk)
    assert [p.pid for p in reply.attached] == [TRAINER, ZOMBIE]  # not WEIRD, uid 1001's
    reply = dispatch(USER, Attach(id=2, pids=[WEIRD]))
    assert isinstance(reply, AttachOk)
    assert reply.failed == [Failure(WEIRD, ErrorCode.PERMISSION_DENIED, f"permission denied: {WEIRD}")]


def test_another_users_process_is_invisible_to_a_non_admin(
    dispatch: Dispatch, registry: Registry
) -> None:
    """For a client that may not see it, a watched process of another user is not watched:
    every reply reads as for a PID nobody watches."""
    dispatch(ADMIN, Attach(id=1, pids=[TRAINER, WEIRD]))
    listed = dispatch(USER, ListProcesses(id=2))
    assert isinstance(listed, ListOk) and [p.pid for p in listed.processes] == [TRAINER]
    admin_list = dispatch(ADMIN, ListProcesses(id=3))
    assert isinstance(admin_list, ListOk) and [p.pid for p in admin_list.processes] == [TRAINER, WEIRD]
    for pid in (WEIRD, 999999):
        detach_failure = Failure(pid, ErrorCode.NO_SUCH_PROCESS,
                                 f"not watched: {pid}" if pid == WEIRD else f"no such process: {pid}")
        assert dispatch(USER, Detach(id=4, pids=[pid])) == DetachOk(4, [], [detach_failure])
        assert dispatch(USER, ResetPeaks(id=5, pids=[pid])) == ResetPeaksOk(5, [], [not_watched(pid)])
        assert dispatch(USER, Stack(id=6, pid=pid, fresh=False)) == Error(
            6, ErrorCode.NO_SUCH_PROCESS, f"no such process: {pid} (not watched)")
        history = dispatch(USER, History(id=7, pids=[pid]))
        assert history == HistoryOk(7, registry.history_step, [])
    assert [w.pid for w in registry.alive] == [TRAINER, WEIRD]  # nothing was detached


def test_detach(dispatch: Dispatch, registry: Registry, proc_tree: ProcTree) -> None:
    dispatch(ADMIN, Attach(id=1, pids=[TRAINER, WEIRD]))
    trainer, weird = registry.entries.values()
    reply = dispatch(USER, Detach(id=2, pids=[TRAINER]))
    assert reply == DetachOk(2, [ProcessRef(TRAINER, trainer.start_time)], [])
    not_watched_now = Failure(TRAINER, ErrorCode.NO_SUCH_PROCESS, f"not watched: {TRAINER}")
    assert dispatch(USER, Detach(id=3, pids=[TRAINER])) == DetachOk(3, [], [not_watched_now])
    proc_tree.exit(WEIRD)
    registry.mark_exited([weird], now=100.0)
    assert dispatch(USER, Detach(id=4, pids=[], exited=True)) == DetachOk(4, [], [])  # not the user's
    assert dispatch(ADMIN, Detach(id=5, pids=[], exited=True)) == DetachOk(5, [ProcessRef(WEIRD, weird.start_time)], [])
    assert not registry.entries


def test_reset_peaks(dispatch: Dispatch, registry: Registry, proc_tree: ProcTree) -> None:
    dispatch(USER, Attach(id=1, pids=[TRAINER, ZOMBIE]))
    proc_tree.set_memory(TRAINER, 100 * MiB, hwm=100 * MiB)  # what the kernel reports after the reset
    reply = dispatch(USER, ResetPeaks(id=2, pids=[TRAINER], kernel=True))
    assert isinstance(reply, ResetPeaksOk) and reply.failed == []
    (info,) = reply.reset
    assert (info.pid, info.rss_bytes, info.rss_peak_bytes, info.rss_peak_exact) == (TRAINER, 100 * MiB, 100 * MiB, True)
    assert proc_tree.read(TRAINER, "clear_refs") == "5"  # the kernel was asked to reset VmHWM
    zombie = registry.find_alive(ZOMBIE)
    assert zombie is not None
    registry.mark_exited([zombie], now=100.0)
    assert dispatch(USER, ResetPeaks(id=3, pids=[ZOMBIE])) == ResetPeaksOk(
        3, [], [Failure(ZOMBIE, ErrorCode.NO_SUCH_PROCESS, f"no such process: {ZOMBIE} (exited)")])


def test_reset_peaks_leaves_the_kernel_mark_alone_by_default(dispatch: Dispatch, proc_tree: ProcTree) -> None:
    """Without ``kernel`` nothing is written: the window restarts on the agent's side, its
    peak sampled until VmHWM passes its value at the reset, then exact (VmHWM itself)."""
    proc_tree.set_memory(TRAINER, 300 * MiB, hwm=300 * MiB)
    dispatch(USER, Attach(id=1, pids=[TRAINER]))
    proc_tree.set_memory(TRAINER, 100 * MiB, hwm=300 * MiB)
    reply = dispatch(USER, ResetPeaks(id=2, pids=[TRAINER]))
    assert isinstance(reply, ResetPeaksOk) and reply.failed == []
    (info,) = reply.reset
    assert (info.rss_peak_bytes, info.rss_peak_exact) == (100 * MiB, False)
    assert proc_tree.read(TRAINER, "clear_refs") == ""  # the target's own ru_maxrss is untouched


def test_a_kernel_reset_only_of_ones_own_process_and_never_of_pid_1(
    dispatch: Dispatch, registry: Registry, proc_tree: ProcTree
) -> None:
    proc_tree.add_process(1, "init", ppid=0, uid=0)
    dispatch(ADMIN, Attach(id=1, pids=[1, TRAINER, WEIRD]))
    never = ("permission denied: 1 (kernel: resetting the kernel's mark resets the process's own ru_maxrss; "
             "never for PID 1)")
    not_yours = ("kernel: resetting the kernel's mark resets the process's own ru_maxrss; "
                 "only for a process of yours (real, effective and saved UID yours, dumpable)")
    reply = dispatch(ADMIN, ResetPeaks(id=2, pids=[1, TRAINER], kernel=True))
    assert reply == ResetPeaksOk(2, [], [
        Failure(1, ErrorCode.PERMISSION_DENIED, never),  # root's own, still refused
        Failure(TRAINER, ErrorCode.PERMISSION_DENIED, f"permission denied: {TRAINER} ({not_yours})"),  # uid 1000's
    ])
    # The user may reset its own, not another user's (which it does not even see) ...
    reply = dispatch(USER, ResetPeaks(id=3, pids=[TRAINER, WEIRD], kernel=True))
    assert [p.pid for p in reply.reset] == [TRAINER] and reply.failed == [not_watched(WEIRD)]
    # ... nor its own once it is not dumpable (its /proc files root's) or changed UIDs.
    os.chown(proc_tree.path(TRAINER, "status"), 0, -1)
    reply = dispatch(USER, ResetPeaks(id=4, pids=[TRAINER], kernel=True))
    assert reply.failed == [
        Failure(TRAINER, ErrorCode.PERMISSION_DENIED, f"permission denied: {TRAINER} ({not_yours})")]
    for pid in (1, TRAINER, WEIRD):  # without kernel, nothing of that applies
        proc_tree.write(pid, "clear_refs", b"")
    reply = dispatch(ADMIN, ResetPeaks(id=5, pids=[1, TRAINER, WEIRD]))
    assert [p.pid for p in reply.reset] == [1, TRAINER, WEIRD] and reply.failed == []
    assert {proc_tree.read(pid, "clear_refs") for pid in (1, TRAINER, WEIRD)} == {""}


def test_list_and_history(dispatch: Dispatch, registry: Registry) -> None:
    dispatch(USER, Attach(id=1, pids=[TRAINER, ZOMBIE]))
    trainer, zombie = registry.entries.values()
    listed = dispatch(USER, ListProcesses(id=2))
    assert listed == ListOk(2, [trainer.info(), zombie.info()])
    reply = dispatch(USER, History(id=3, pids=[TRAINER], seconds=60.0))
    end, values = trainer.history.series(60.0)
    assert reply == HistoryOk(3, registry.history_step, [Series(TRAINER, trainer.start_time, end, values)])
    assert values == [trainer.rss]
    everything = dispatch(USER, History(id=4))
    assert isinstance(everything, HistoryOk) and [s.pid for s in everything.series] == [TRAINER, ZOMBIE]


def test_stack_of_a_watched_process(dispatch: Dispatch, registry: Registry) -> None:
    dispatch(USER, Attach(id=1, pids=[TRAINER]))
    (w,) = registry.alive
    reply = dispatch(USER, Stack(id=2, pid=TRAINER, fresh=False))
    assert reply == StackOk(2, TRAINER, w.start_time, StackState.DISABLED, None, None, None, [], [])


async def test_a_fresh_stack_is_sent_when_taken(registry: Registry) -> None:
    dispatcher = Dispatcher(registry, StackCollector(StackConfig(enabled=False)), daemon_status)
    (w,) = registry.attach(TRAINER)
    session = Session(USER)
    assert await dispatcher.handle(session, Stack(id=3, pid=TRAINER, fresh=True)) is None  # type: ignore[arg-type]
    await asyncio.wait_for(session.got.wait(), 5)
    assert session.sent == [StackOk(3, TRAINER, w.start_time, StackState.DISABLED, None, None, None, [], [])]


async def test_subscribe_status_and_unknown_requests(registry: Registry) -> None:
    dispatcher = Dispatcher(registry, StackCollector(StackConfig(enabled=False)), daemon_status)
    session = Session(USER)
    assert await dispatcher.handle(session, Subscribe(id=1)) == Ack(1)  # type: ignore[arg-type]
    assert session.subscribed
    assert await dispatcher.handle(session, Unsubscribe(id=2)) == Ack(2)  # type: ignore[arg-type]
    assert not session.subscribed
    assert await dispatcher.handle(session, Status(id=3)) == StatusOk(3, daemon_status(USER))  # type: ignore[arg-type]
    assert await dispatcher.handle(session, Ack(id=4)) == Error(  # type: ignore[arg-type]
        4, ErrorCode.UNKNOWN_REQUEST, "'ack' is not a request")
    hello = Hello(version=[1, 0], role="client", software="x")
    assert await dispatcher.handle(session, hello) == Error(  # type: ignore[arg-type]
        None, ErrorCode.UNKNOWN_REQUEST, "'hello' is not a request")
    assert session.sent == []
