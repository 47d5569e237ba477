"""What one client can make the daemon hold or do (docs/security.md): requests refused
while unpacking, PIDs deduplicated, labels checked, events a client does not read, and
request work cut into slices that never overlap the tick's deadline."""

from __future__ import annotations

import asyncio
import math
import socket
import time

import msgpack
import pytest
from proctree import TRAINER, WEIRD, ProcTree

from memagent.alerting.engine import AlertEngine
from memagent.config import AlertConfig, HeadroomConfig, StackConfig
from memagent.core.pacing import Pacer
from memagent.core.registry import Registry
from memagent.core.sampler import Ticker
from memagent.core.stack_collector import StackCollector
from memagent.proc.kmsg import KernelLog
from memagent.serve.access import Access, Peer
from memagent.serve.dispatch import Dispatcher
from memagent.serve.session import MAX_EVENT_BACKLOG, ClientSession
from memproto import ProtocolError, decode, frame_bytes, unpack
from memproto.frames import Attach, AttachOk, Error, ListOk, ListProcesses
from memproto.limits import MAX_REQUEST_PIDS
from memproto.records import DaemonStatus, HostMemory, TickStats
from memproto.text import MAX_LABEL_CHARS
from memproto.vocabulary import ErrorCode

USER = Access(Peer(pid=7001, uid=1000, gid=1000, groups=frozenset()), sees_all=False)
ROOT = Access(Peer(pid=7002, uid=0, gid=0, groups=frozenset()), sees_all=True)


class Session:
    def __init__(self, access: Access) -> None:
        self.access = access
        self.subscribed = False
        self.deferred = 0

    def send(self, frame: object, request_id: int | None = None) -> None:
        raise AssertionError("no deferred reply expected")


def status(access: Access) -> DaemonStatus:
    return DaemonStatus("t", 1, 0, 1.0, 0.5, "/s", 0, 0, 1, TickStats(0, 0.0, 0.0, 0, 0.0), HostMemory(0, 0, 0, 0))


def dispatcher(registry: Registry, pacer: Pacer | None = None) -> Dispatcher:
    return Dispatcher(registry, StackCollector(StackConfig(enabled=False)), status, pacer)


# --------------------------------------------------------------------------- unpacking


def test_a_request_with_too_many_pids_is_refused_while_unpacking() -> None:
    """15,000 PIDs in one attach: refused by msgpack's limit before any list is built."""
    body = {"t": "attach", "v": 1, "id": 1, "pids": [TRAINER] * 15_000, "label": "x"}
    payload = msgpack.packb(body)
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        unpack(payload, request=True)
    assert len(unpack(payload)["pids"]) == 15_000  # what a client (not a server) still accepts
    ok = msgpack.packb({**body, "pids": [TRAINER] * MAX_REQUEST_PIDS})
    assert len(unpack(ok, request=True)["pids"]) == MAX_REQUEST_PIDS


def test_a_long_string_in_a_request_is_refused_while_unpacking() -> None:
    payload = msgpack.packb({"t": "attach", "v": 1, "id": 1, "pids": [1], "label": "x" * 65_536})
    with pytest.raises(ProtocolError):
        unpack(payload, request=True)


# --------------------------------------------------------------------------- dispatch


def test_repeated_pids_are_attached_and_answered_once(registry: Registry) -> None:
    reply = asyncio.run(dispatcher(registry).handle(Session(USER), Attach(1, [TRAINER] * 4000, "run")))  # type: ignore[arg-type]
    assert isinstance(reply, AttachOk)
    assert [p.pid for p in reply.attached] == [TRAINER] and reply.failed == []


@pytest.mark.parametrize("label", ["a\nmemagent: CRITICAL: forged", "\x1b[31mred", "x" * (MAX_LABEL_CHARS + 1), ""])
def test_a_bad_label_fails_the_request_and_attaches_nothing(registry: Registry, label: str) -> None:
    reply = asyncio.run(dispatcher(registry).handle(Session(USER), Attach(1, [TRAINER], label)))  # type: ignore[arg-type]
    assert isinstance(reply, Error) and reply.code == ErrorCode.INVALID and reply.message.startswith("label: ")
    assert registry.entries == {}


def test_a_label_of_the_longest_kind_is_accepted(registry: Registry) -> None:
    reply = asyncio.run(dispatcher(registry).handle(Session(USER), Attach(1, [TRAINER], "é" * MAX_LABEL_CHARS)))  # type: ignore[arg-type]
    assert isinstance(reply, AttachOk) and reply.attached[0].label == "é" * MAX_LABEL_CHARS


async def test_a_non_admin_label_does_not_count_in_the_operators_budget(
    registry: Registry, proc_tree: ProcTree
) -> None:
    """A user labels its process with the label root's budget is for: not counted."""
    d = dispatcher(registry)
    await d.handle(Session(USER), Attach(1, [TRAINER], "resnet"))  # type: ignore[arg-type]
    await d.handle(Session(ROOT), Attach(2, [WEIRD], "resnet"))  # type: ignore[arg-type]
    (theirs,) = registry.find(TRAINER)
    (ours,) = registry.find(WEIRD)
    assert (theirs.label_trusted, ours.label_trusted) == (False, True)
    delivered = []
    kmsg = proc_tree.root / "kmsg"
    kmsg.write_bytes(b"")
    engine = AlertEngine(registry, HeadroomConfig(), AlertConfig(budgets={"resnet": 1}), delivered.append,
                         lambda w: None, kmsg=KernelLog(str(kmsg)))
    try:
        engine.on_tick(time.time(), [], [])
        await engine.pss_settled()
    finally:
        engine.close()
    (alert,) = [a for a in delivered if a.kind == "budget"]
    assert [c.pid for c in alert.contributors] == [WEIRD]


# --------------------------------------------------------------------------- pacing


async def _list_while_ticking(registry: Registry, paced: bool, interval: float) -> tuple[Ticker, int, int]:
    """List every process while a ticker runs every ``interval`` seconds: the ticker, the
    ticks it ran while the request was in flight, and how many times the request gave way."""
    ticker = Ticker(interval, lambda now: None)
    running = asyncio.ensure_future(ticker.run())
    try:
        await asyncio.sleep(0)  # the first tick runs; the request starts just after it
        pacer = Pacer(ticker, slice_seconds=interval / 5) if paced else Pacer(None, slice_seconds=math.inf)
        before = ticker.ticks
        reply = await dispatcher(registry, pacer).handle(Session(ROOT), ListProcesses(1))  # type: ignore[arg-type]
        during = ticker.ticks - before
        await ticker.next_tick()
    finally:
        running.cancel()
    listed = decode(reply) if isinstance(reply, bytes) else reply
    assert isinstance(listed, ListOk) and len(listed.processes) == len(registry.entries)
    return ticker, during, pacer.yields


async def test_a_long_request_gives_the_tick_its_turn(registry: Registry) -> None:
    """A list of many processes is built and packed in slices: ticks due meanwhile run
    while it is in flight, where an unsliced request holds them all back until it ends.

    Counted in the ticker's own clock (ticks run, deadlines missed), with the tick period
    sized from this machine's own time for the request, so a slow or busy machine slows
    both sides alike (issue 29): the unsliced request spans about ten periods."""
    for pid in (TRAINER, WEIRD):
        registry.attach(pid)
    entries = list(registry.entries.values())
    for i in range(1500):  # many records: the same two processes, listed again and again
        registry.entries[(i, i)] = entries[i % 2]
    d = dispatcher(registry, Pacer(None, slice_seconds=math.inf))
    await d.handle(Session(ROOT), ListProcesses(1))  # type: ignore[arg-type]  # warm up
    started = time.perf_counter()
    await d.handle(Session(ROOT), ListProcesses(1))  # type: ignore[arg-type]
    interval = max((time.perf_counter() - started) / 10, 0.0005)
    unpaced, unpaced_during, no_yields = await _list_while_ticking(registry, paced=False, interval=interval)
    _, paced_during, yields = await _list_while_ticking(registry, paced=True, interval=interval)
    assert no_yields == 0 and unpaced_during == 0, "an unsliced request let a tick run"
    assert unpaced.overruns >= 1, f"the unsliced request held no deadline back ({interval * 1e3:.2f} ms period)"
    assert yields > 0 and paced_during >= 2, (
        f"the sliced request let {paced_during} ticks run in about ten periods ({yields} yields, "
        f"{interval * 1e3:.2f} ms period)")


# --------------------------------------------------------------------------- events a client does not read


async def test_a_subscriber_that_does_not_read_is_disconnected_after_a_bounded_backlog() -> None:
    ours, theirs = socket.socketpair()
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader, writer = await asyncio.open_connection(sock=ours)
    session = ClientSession(reader, writer, USER)
    writing = asyncio.ensure_future(session.write_loop())
    event = frame_bytes(b"\x81\xa1t\xa5alert" + b"\x00" * 4000)
    sent = 0
    while not session.closing and sent < 4 * MAX_EVENT_BACKLOG:
        session.send_event(event)
        sent += len(event)
        await asyncio.sleep(0)
    await asyncio.wait_for(writing, 5)
    assert session.closing
    assert sent <= MAX_EVENT_BACKLOG + 2 * 1024 * 1024  # what the socket buffers took, plus the backlog
    theirs.close()
