"""Shared material of the codec tests: one realistic instance of every frame type, and
raw frame maps built by hand as a newer, older or broken peer would send them."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from memproto import PROTOCOL_MAJOR, SAMPLE_FIELDS, Frame, ProtocolError, decode
from memproto.frames import (
    Ack,
    AlertRaised,
    Attach,
    Attached,
    AttachOk,
    Detach,
    Detached,
    DetachOk,
    Dropped,
    Error,
    Exited,
    Hello,
    History,
    HistoryOk,
    ListOk,
    ListProcesses,
    ResetPeaks,
    ResetPeaksOk,
    Sample,
    Stack,
    StackOk,
    StackStateChanged,
    Status,
    StatusOk,
    Subscribe,
    Unsubscribe,
)
from memproto.records import (
    Alert,
    Contributor,
    DaemonStatus,
    Failure,
    GrowthSite,
    HostMemory,
    ProcessInfo,
    ProcessRef,
    Series,
    StackDump,
    StackFrame,
    ThreadStack,
    TickStats,
)
from memproto.schema import to_wire

MiB = 1024 * 1024
GiB = 1024 * MiB

TRAINER = ProcessInfo(
    pid=4242,
    start_time=1_700_000_512.37,
    name="python3",
    cmdline=["python3", "-m", "train", "--epochs=3", "--note=ünïcode ✓"],
    label="run-17",
    uid=1000,
    alive=True,
    attached_at=1_700_000_600.0,
    exited_at=None,
    rss_bytes=512 * MiB,
    rss_peak_bytes=793 * MiB,
    anon_bytes=473 * MiB,
    swap_bytes=2 * MiB,
    rss_peak_exact=True,
    peak_since=1_700_000_512.37,
)
FINISHED = ProcessInfo(
    pid=4243,
    start_time=1_700_000_513.0,
    name="worker",
    cmdline=[],
    label=None,
    uid=1000,
    alive=False,
    attached_at=1_700_000_600.0,
    exited_at=1_700_000_900.25,
    rss_bytes=0,
    rss_peak_bytes=12 * MiB,
    anon_bytes=0,
    swap_bytes=0,
    rss_peak_exact=False,
    peak_since=1_700_000_700.5,
)
DENIED = Failure(pid=1, code="permission_denied", message="permission denied: 1")
GONE = Failure(pid=99999, code="no_such_process", message="no such process: 99999")
SAMPLE_ROWS: list[list[Any]] = [
    [4242, 1_700_000_512.37, True, 512 * MiB, 793 * MiB, 473 * MiB, 2 * MiB],
    [4243, 1_700_000_513.0, False, 0, 12 * MiB, 0, 0],
]

#: One realistic instance of every frame type, by wire tag.
EXAMPLES: dict[str, Frame] = {
    "hello": Hello(version=[1, 0], role="server", software="memagent 0.1.0", interval=1.0, pid=812),
    "attach": Attach(id=1, pids=[4242, 4243], label="run-17", children=True),
    "detach": Detach(id=2, pids=[4242], exited=True),
    "reset_peaks": ResetPeaks(id=3, pids=[4242, 4243]),
    "list": ListProcesses(id=4),
    "subscribe": Subscribe(id=5),
    "unsubscribe": Unsubscribe(id=6),
    "history": History(id=7, pids=[4242], seconds=120.0),
    "status": Status(id=8),
    "attach_ok": AttachOk(id=1, attached=[TRAINER, FINISHED], failed=[DENIED, GONE]),
    "detach_ok": DetachOk(
        id=2, detached=[ProcessRef(pid=4242, start_time=1_700_000_512.37)], failed=[GONE]
    ),
    "reset_peaks_ok": ResetPeaksOk(id=3, reset=[TRAINER], failed=[DENIED]),
    "list_ok": ListOk(id=4, processes=[TRAINER, FINISHED]),
    "history_ok": HistoryOk(
        id=7,
        step=1.0,
        series=[
            Series(pid=4242, start_time=1_700_000_512.37, end_time=1_700_000_960.0,
                   rss_bytes=[500 * MiB, 793 * MiB, 512 * MiB]),
            Series(pid=4243, start_time=1_700_000_513.0, end_time=1_700_000_901.0, rss_bytes=[]),
        ],
    ),
    "status_ok": StatusOk(
        id=8,
        status=DaemonStatus(
            software="memagent 0.1.0",
            pid=812,
            uid=0,
            started_at=1_700_000_000.5,
            interval=1.0,
            socket="/run/memagent/memagent.sock",
            watched=2,
            alive=1,
            clients=3,
            tick=TickStats(ticks=960, mean_interval=1.0002, max_lateness=0.013, overruns=1,
                           last_duration=0.0007),
            host=HostMemory(total_bytes=32 * 1024 * MiB, available_bytes=24 * 1024 * MiB,
                            swap_total_bytes=8 * 1024 * MiB, swap_free_bytes=7 * 1024 * MiB),
            dropped_samples=41,
        ),
    ),
    "ack": Ack(id=5),
    "error": Error(id=None, code="protocol", message="attach.pids[1]: expected int, got str"),
    "sample": Sample(seq=960, time=1_700_000_960.0, interval=1.0, fields=list(SAMPLE_FIELDS),
                     rows=SAMPLE_ROWS),
    "attached": Attached(process=TRAINER),
    "exited": Exited(pid=4243, start_time=1_700_000_513.0, time=1_700_000_900.25,
                     rss_peak_bytes=12 * MiB),
    "detached": Detached(pid=4242, start_time=1_700_000_512.37),
    "dropped": Dropped(count=17),
    "stack": Stack(id=12, pid=4242, fresh=False),
    "alert": AlertRaised(Alert(
        id=3, kind="headroom", state="firing", severity="critical", resource="host", value=1.53, threshold=1.0,
        message="Σ peaks 460 MiB would use 153% of the 300 MiB headroom of host memory", time=1_700_000_961.0,
        contributors=[Contributor(4242, "bert", 160 * MiB)], unit="ratio",
    )),
    "stack_ok": StackOk(
        id=12, pid=4242, start_time=1_700_000_512.37, state="ok", message=None,
        latest=StackDump(
            time=1_700_000_960.5, trigger="peak", rss_bytes=793 * MiB, vram_bytes=None,
            threads=[
                ThreadStack(thread_id=140001, name="MainThread", active=True, owns_gil=True,
                            frames=[StackFrame("hold_memory", "/srv/model.py", 12),
                                    StackFrame("<module>", "/srv/model.py", 30)]),
                ThreadStack(thread_id=140002, name="<b>[worker]</b>", active=False, owns_gil=False, frames=[]),
            ],
            attributed_thread=140001,
        ),
        at_peak=None,
        by_line=[GrowthSite("hold_memory", "/srv/model.py", 12, 700 * MiB, 3)],
        by_function=[GrowthSite("hold_memory", "/srv/model.py", None, 700 * MiB, 3)],
    ),
    "stack_state": StackStateChanged(pid=4242, start_time=1_700_000_512.37, state="permission_denied",
                                     message="permission denied: run the daemon as root or with CAP_SYS_PTRACE"),
}


def body(tag: str, **fields: Any) -> dict[str, Any]:
    """A raw frame map as a peer would send it."""
    return {"t": tag, "v": PROTOCOL_MAJOR, **fields}


def packed(tag: str, **fields: Any) -> bytes:
    """msgpack bytes of a raw frame map, bypassing the encoder's typing."""
    return msgpack.packb(body(tag, **fields), use_bin_type=True)  # type: ignore[no-any-return]


def info_map(**changes: Any) -> dict[str, Any]:
    """The wire map of TRAINER, with some fields replaced."""
    data = to_wire(TRAINER)
    data.update(changes)
    return data  # type: ignore[no-any-return]


def sample_payload(fields: list[str], rows: list[list[Any]]) -> bytes:
    """A sample frame with hand-picked columns, as a newer or a broken agent might send."""
    return packed("sample", seq=1, time=1_700_000_960.0, interval=1.0, fields=fields, rows=rows)


def decode_error(payload: bytes) -> ProtocolError:
    """The ProtocolError that decoding ``payload`` raises."""
    with pytest.raises(ProtocolError) as info:
        decode(payload)
    return info.value
