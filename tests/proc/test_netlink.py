"""The netlink messages of process events (:mod:`memagent.proc.netlink_msg`): parsed from
bytes laid out as the kernel's headers say, and, where the kernel lets this test listen
(root), from live kernel messages, checked against pyroute2's decoders."""

from __future__ import annotations

import os
import pwd
import select
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from conftest import as_user

from memagent.proc.netlink import ProcessEventSource, open_source
from memagent.proc.netlink_msg import (
    EXEC,
    FORK,
    ConnectorAck,
    ExitStats,
    ProcEvent,
    listen_request,
    parse_exit_stats,
    parse_proc_event,
    parse_reply,
)

FAMILY = 31
KiB = 1024


# --------------------------------------------------------------------------- built by hand


def _connector(what: int, data: bytes, ack: int = 0) -> bytes:
    event = struct.pack("=IIQ", what, 0, 123456789) + data
    body = struct.pack("=IIIIHH", 1, 1, 7, ack, len(event), 0) + event
    return struct.pack("=IHHII", 16 + len(body), 3, 0, 0, 0) + body


def _attr(nla_type: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), nla_type) + payload
    return raw + b"\0" * (-len(raw) % 4)


UID, PPID, BTIME = 1000, 4100, 1_700_000_000


def _stats(version: int, hiwater_kib: int, comm: bytes = b"python3") -> bytes:
    """A ``struct taskstats`` of ``version``: 16 (and every one but 15) keeps ``ac_comm`` at
    80, ``ac_uid`` at 120, ``ac_ppid`` and ``ac_btime`` at 132 and ``hiwater_rss`` at
    200; 15 has 48 more bytes before ``ac_comm``."""
    shift = 48 if version == 15 else 0
    raw = bytearray(440)
    struct.pack_into("=H", raw, 0, version)
    raw[80 + shift:80 + shift + len(comm)] = comm
    struct.pack_into("=I", raw, 120 + shift, UID)
    struct.pack_into("=II", raw, 132 + shift, PPID, BTIME)
    struct.pack_into("=Q", raw, 200 + shift, hiwater_kib)
    return bytes(raw)


def _taskstats(pid: int, hiwater_kib: int, tgid: int | None = None, version: int = 16,
               family: int = FAMILY) -> bytes:
    attrs = _attr(4 | 0x8000, _attr(1, struct.pack("=I", pid)) + _attr(3, _stats(version, hiwater_kib)))
    if tgid is not None:
        attrs += _attr(5 | 0x8000, _attr(2, struct.pack("=I", tgid)) + _attr(3, _stats(version, 0)))
    body = struct.pack("=BBH", 2, 1, 0) + attrs
    return struct.pack("=IHHII", 16 + len(body), family, 0, 0, 0) + body


def test_a_process_fork_names_the_child_and_its_parent_process() -> None:
    # Forked by thread 101 of process 100: the parent is the process.
    assert parse_proc_event(_connector(1, struct.pack("=IIII", 101, 100, 200, 200))) == ProcEvent(FORK, 200, 100)


def test_a_new_thread_is_not_a_process() -> None:
    assert parse_proc_event(_connector(1, struct.pack("=IIII", 100, 100, 201, 100))) is None


def test_exec_and_ack() -> None:
    assert parse_proc_event(_connector(2, struct.pack("=II", 300, 300))) == ProcEvent(EXEC, 300)
    assert parse_proc_event(_connector(0, struct.pack("=I", 1), ack=43)) == ConnectorAck(43, 1)


def test_other_events_and_short_or_foreign_messages_are_skipped() -> None:
    assert parse_proc_event(_connector(0x80000000, struct.pack("=IIIIII", 5, 5, 0, 17, 1, 1))) is None  # exit
    assert parse_proc_event(_connector(0x200, struct.pack("=II", 5, 5) + b"name".ljust(16, b"\0"))) is None  # comm
    assert parse_proc_event(_connector(1, b"")) is None  # cut short
    foreign = bytearray(_connector(2, struct.pack("=II", 300, 300)))
    struct.pack_into("=I", foreign, 16, 4)  # another connector index
    assert parse_proc_event(bytes(foreign)) is None


def test_a_listen_request_is_what_the_kernel_expects() -> None:
    plain = listen_request(41)
    assert len(plain) == 16 + 20 + 4
    assert struct.unpack_from("=IIIIHHI", plain, 16) == (1, 1, 0, 41, 4, 0, 1)
    assert struct.unpack_from("=HHII", listen_request(41, 3), 32) == (8, 0, 1, 3)


def test_an_exit_record_of_a_single_threaded_process() -> None:
    assert parse_exit_stats(_taskstats(4242, 313 * KiB), FAMILY) == ExitStats(4242, None, 313 * KiB * KiB,
                                                                               "python3", 16, UID, PPID, BTIME)


def test_the_last_thread_of_a_group_names_the_process() -> None:
    record = parse_exit_stats(_taskstats(4250, 2048, tgid=4242), FAMILY)
    assert record is not None and (record.pid, record.tgid, record.hiwater_rss_bytes) == (4250, 4242, 2048 * KiB)


@pytest.mark.parametrize("version", [8, 14, 15, 16, 17])
def test_every_layout_of_struct_taskstats(version: int) -> None:
    record = parse_exit_stats(_taskstats(1, 777, version=version), FAMILY)
    assert record is not None
    assert (record.hiwater_rss_bytes, record.comm, record.uid, record.ppid, record.btime) == (
        777 * KiB, "python3", UID, PPID, BTIME)


def test_not_an_exit_record() -> None:
    assert parse_exit_stats(_taskstats(1, 777, family=FAMILY + 1), FAMILY) is None
    assert parse_exit_stats(_taskstats(1, 777)[:150], FAMILY) is None  # cut inside the stats
    assert parse_reply(struct.pack("=IHHIIi", 20, 2, 0, 9, 0, -1)).error == -1  # type: ignore[union-attr]


# --------------------------------------------------------------------------- live, against pyroute2


@pytest.fixture
def source() -> Iterator[ProcessEventSource]:
    src, why = open_source()
    if src is None:
        pytest.skip(f"cannot listen to process events here: {why}")
    yield src
    src.close()


@pytest.mark.e2e
def test_live_messages_parse_as_pyroute2_decodes_them(source: ProcessEventSource) -> None:
    """A process with a thread, 64 MiB resident at its end: its fork, exec and exit
    record as the kernel sends them, decoded by both."""
    pyroute2_cn = pytest.importorskip("pyroute2.netlink.connector.cn_proc")
    pyroute2_ts = pytest.importorskip("pyroute2.netlink.taskstats")
    child = subprocess.Popen([sys.executable, "-c", "import threading; t = threading.Thread(target=print); "
                              "t.start(); t.join(); block = b'x' * (64 << 20)"], stdout=subprocess.DEVNULL)
    child.wait()
    deadline = time.monotonic() + 5
    raw_events: list[bytes] = []
    raw_exits: list[bytes] = []
    while time.monotonic() < deadline and not any(
            (r := parse_exit_stats(d, source.family)) is not None and r.tgid == child.pid for d in raw_exits):
        raw_exits += source.receive(source.taskstats)
        raw_events += source.receive(source.connector)
        time.sleep(0.01)

    ours = [parse_exit_stats(d, source.family) for d in raw_exits]
    for data, record in zip(raw_exits, ours, strict=True):
        msg = pyroute2_ts.taskstatsmsg(data)
        msg.decode()
        aggr = msg.get_attr("TASKSTATS_TYPE_AGGR_PID")
        if aggr is None:
            assert record is None
            continue
        assert record is not None
        assert record.pid == aggr.get_attr("TASKSTATS_TYPE_PID")
        stats = aggr.get_attr("TASKSTATS_TYPE_STATS")
        assert record.hiwater_rss_bytes == stats["hiwater_rss"] * KiB
        assert (record.uid, record.ppid, record.btime) == (stats["ac_uid"], stats["ac_ppid"], stats["ac_btime"])
        tgid = msg.get_attr("TASKSTATS_TYPE_AGGR_TGID")
        assert record.tgid == (tgid.get_attr("TASKSTATS_TYPE_TGID") if tgid is not None else None)
    # The thread's exit, then the process's: the last thread of the group, with its tgid.
    (final,) = [r for r in ours if r is not None and r.tgid == child.pid]
    assert 64 << 20 <= final.hiwater_rss_bytes <= 128 << 20
    assert (final.ppid, final.uid) == (os.getpid(), os.getuid())
    assert [r for r in ours if r is not None and r.pid != child.pid and r.tgid is None]  # the thread

    marshal = pyroute2_cn.ProcEventMarshal()
    mine: list[ProcEvent] = []
    for data in raw_events:
        (theirs,) = marshal.parse(data)
        event = parse_proc_event(data)
        if theirs["event"] == "PROC_EVENT_FORK" and theirs["child_pid"] == theirs["child_tgid"]:
            assert event == ProcEvent(FORK, theirs["child_tgid"], theirs["parent_tgid"])
        elif theirs["event"] == "PROC_EVENT_EXEC":
            assert event == ProcEvent(EXEC, theirs["process_tgid"])
        else:
            assert not isinstance(event, ProcEvent)
        if isinstance(event, ProcEvent) and event.pid == child.pid:
            mine.append(event)
    assert [e.kind for e in mine] == [FORK, EXEC]


#: Forks two hundred children that exit at once, and reaps them: a burst of fork events
#: and exit records.
_BURST = """import os
for _ in range(200):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
"""


@pytest.mark.e2e
def test_an_overrun_is_counted_per_socket_and_reading_goes_on(source: ProcessEventSource) -> None:
    """A burst while the reader does not read: a socket with the smallest receive buffer
    the kernel allows (a few KiB) overflows. The loss is counted, the messages queued
    before it are still read, and so is what comes after."""
    for sock in (source.taskstats, source.connector):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
    subprocess.run([sys.executable, "-S", "-c", _BURST], check=True)
    events, exits = source.read_pending()
    assert (source.record_overruns, source.event_overruns) >= (1, 1)
    assert source.overruns == source.record_overruns + source.event_overruns
    assert 0 < len(exits) < 200 and 0 < len(events) < 200
    # Room again: the sockets still work.
    for sock in (source.taskstats, source.connector):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    subprocess.run(["true"], check=True)
    seen: list[ExitStats] = []
    while not any(r.comm == "true" for r in seen):
        assert select.select([source.taskstats], [], [], 5.0)[0], "no exit record after the overrun"
        seen += source.read_pending()[1]


def test_an_unprivileged_process_gets_the_reason(test_user: pwd.struct_passwd) -> None:
    def attempt() -> object:
        source, why = open_source()
        return [source is None, why]

    refused, why = as_user(test_user, attempt)
    assert refused
    # In a container the kernel may answer with the namespace rule first.
    assert why in ("taskstats: not permitted: needs root (CAP_NET_ADMIN)",
                   "taskstats: refused: the daemon is not in the initial PID and user namespaces (a container?)")
