"""The bytes of the two netlink protocols the agent listens to, built and parsed by hand
(pure functions, no socket: :mod:`memagent.proc.netlink` does the I/O).

* The **proc connector** (``NETLINK_CONNECTOR``, ``CN_IDX_PROC``): one datagram per process
  event, ``nlmsghdr`` + ``cn_msg`` + ``proc_event`` (``linux/cn_proc.h``). The agent uses
  ``fork`` (at the child's first instant, before it runs) and ``exec``.
* **taskstats** (generic netlink family ``TASKSTATS``): with a CPU mask registered, the
  kernel sends one record per task that exits, built in ``do_exit`` *before* the task
  drops its memory map, with ``hiwater_rss``: the task's mm's high-water RSS (VmHWM), in
  KiB (``linux/taskstats.h``).

Why by hand and not with pyroute2 (which speaks both): importing it costs the daemon
11 MiB of RSS (214 modules) and it imports :mod:`ssl`, which the daemon keeps out (4 MiB,
:func:`memagent.daemon.skip_tls_import`): ~15 MiB on a daemon whose target is 30 MB at
1000 processes. Its decoders take ~16 µs per connector event where ``struct`` takes
~0.7 µs, and both streams carry every fork and exit of the box. The tests check these
parsers against pyroute2's decoders on live kernel messages.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

NETLINK_CONNECTOR: Final = 11
NETLINK_GENERIC: Final = 16

NLMSG_ERROR: Final = 2
NLMSG_DONE: Final = 3
NLM_F_REQUEST: Final = 0x1
NLM_F_ACK: Final = 0x4
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_NLATTR = struct.Struct("=HH")  # len, type
_NLA_TYPE_MASK: Final = 0x3FFF

# ----------------------------------------------------------------------------- proc connector

CN_IDX_PROC: Final = 1
CN_VAL_PROC: Final = 1
PROC_CN_MCAST_LISTEN: Final = 1
PROC_CN_MCAST_IGNORE: Final = 2
PROC_EVENT_NONE: Final = 0x0
PROC_EVENT_FORK: Final = 0x1
PROC_EVENT_EXEC: Final = 0x2
PROC_EVENT_EXIT: Final = 0x80000000
_CN_MSG = struct.Struct("=IIIIHH")  # idx, val, seq, ack, len, flags
_EVENT_HEAD = struct.Struct("=IIQ")  # what, cpu, timestamp_ns
_FORK = struct.Struct("=IIII")  # parent_pid, parent_tgid, child_pid, child_tgid
_EXEC = struct.Struct("=II")  # process_pid, process_tgid
_EVENT_AT: Final = _NLMSGHDR.size + _CN_MSG.size
_DATA_AT: Final = _EVENT_AT + _EVENT_HEAD.size

FORK: Final = "fork"
EXEC: Final = "exec"


@dataclass(frozen=True, slots=True)
class ProcEvent:
    """A process (not a thread) began: ``fork`` (``pid`` the child, ``parent`` the parent
    process's PID) or ran a new program: ``exec`` (``parent`` 0)."""

    kind: str
    pid: int
    parent: int = 0


@dataclass(frozen=True, slots=True)
class ConnectorAck:
    """The kernel's answer to a listen request: ``err`` 0, or an errno (EPERM); ``ack``
    is the request's ``ack`` + 1 (the kernel does not echo its ``seq``)."""

    ack: int
    err: int


def listen_request(ack: int, events: int | None = None) -> bytes:
    """``PROC_CN_MCAST_LISTEN``: for every event (acknowledged), or, since Linux 6.6, for
    the ``events`` mask only (not acknowledged: the kernel filters its own ack out; older
    kernels ignore this form)."""
    op = struct.pack("=I", PROC_CN_MCAST_LISTEN) if events is None else struct.pack("=II", PROC_CN_MCAST_LISTEN,
                                                                                    events)
    body = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, ack, len(op), 0) + op
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), NLMSG_DONE, 0, 0, 0) + body


def parse_proc_event(data: bytes | bytearray | memoryview) -> ProcEvent | ConnectorAck | None:
    """One connector datagram: a process's fork or exec, the ack of a listen request, or
    None (a thread's fork, another event, another connector's message)."""
    if len(data) < _DATA_AT:
        return None
    idx, val, _seq, ack, _len, _flags = _CN_MSG.unpack_from(data, _NLMSGHDR.size)
    if idx != CN_IDX_PROC or val != CN_VAL_PROC:
        return None
    what = _EVENT_HEAD.unpack_from(data, _EVENT_AT)[0]
    if what == PROC_EVENT_FORK and len(data) >= _DATA_AT + _FORK.size:
        _parent_pid, parent_tgid, child_pid, child_tgid = _FORK.unpack_from(data, _DATA_AT)
        return ProcEvent(FORK, child_tgid, parent_tgid) if child_pid == child_tgid else None
    if what == PROC_EVENT_EXEC and len(data) >= _DATA_AT + _EXEC.size:
        return ProcEvent(EXEC, _EXEC.unpack_from(data, _DATA_AT)[1])
    if what == PROC_EVENT_NONE and len(data) >= _DATA_AT + 4:
        return ConnectorAck(ack, struct.unpack_from("=I", data, _DATA_AT)[0])
    return None


# ----------------------------------------------------------------------------- generic netlink, taskstats

GENL_ID_CTRL: Final = 0x10
CTRL_CMD_GETFAMILY: Final = 3
CTRL_ATTR_FAMILY_ID: Final = 1
CTRL_ATTR_FAMILY_NAME: Final = 2
TASKSTATS_GENL_NAME: Final = b"TASKSTATS"
TASKSTATS_CMD_GET: Final = 1
TASKSTATS_CMD_NEW: Final = 2
TASKSTATS_CMD_ATTR_REGISTER_CPUMASK: Final = 3
TASKSTATS_CMD_ATTR_DEREGISTER_CPUMASK: Final = 4
TASKSTATS_TYPE_PID: Final = 1
TASKSTATS_TYPE_TGID: Final = 2
TASKSTATS_TYPE_STATS: Final = 3
TASKSTATS_TYPE_AGGR_PID: Final = 4
TASKSTATS_TYPE_AGGR_TGID: Final = 5
_GENLMSGHDR = struct.Struct("=BBH")  # cmd, version, reserved
_ATTRS_AT: Final = _NLMSGHDR.size + _GENLMSGHDR.size

#: Offsets in ``struct taskstats``. The struct only grows at its end, except version 15
#: (Linux 6.16-6.17), which inserted the delay maxima and minima in the middle (48 bytes
#: before ``ac_comm``); version 16 moved them to the end again.
_HIWATER_RSS: Final = 200
_COMM: Final = 80
_UID: Final = 120  # ac_uid (the real UID), then ac_gid, ac_pid, ac_ppid, ac_btime: u32 each
_PPID: Final = 132
_BTIME: Final = 136
_V15_SHIFT: Final = 48


@dataclass(frozen=True, slots=True)
class ExitStats:
    """A task's exit record. ``pid`` is the task (a thread ID, the process's PID for its
    main thread); ``tgid`` is set when this exit ended its thread group (a process that had
    other threads). ``hiwater_rss_bytes``: its memory map's high-water RSS as it exited.

    No field says whether a record without ``tgid`` ended its process: a main thread that
    exits before the others (``pthread_exit``) sends one too, and the group's own record
    (with ``tgid``) follows when its last thread exits (see
    :mod:`memagent.core.process_events`). ``uid`` (real), ``ppid`` (its parent process at
    its exit) and ``btime`` (its start, Unix seconds) describe a process the agent never
    opened: a child reaped before its fork event was handled."""

    pid: int
    tgid: int | None
    hiwater_rss_bytes: int
    comm: str
    version: int
    uid: int = 0
    ppid: int = 0
    btime: int = 0


@dataclass(frozen=True, slots=True)
class NetlinkReply:
    """An ack or error (``error`` 0 or a negative errno), or a family lookup's answer."""

    seq: int
    error: int = 0
    family_id: int | None = None


def _attr(nla_type: int, payload: bytes) -> bytes:
    raw = _NLATTR.pack(_NLATTR.size + len(payload), nla_type) + payload
    return raw + b"\0" * (-len(raw) % 4)


def genl_request(family: int, cmd: int, seq: int, attrs: list[tuple[int, bytes]], ack: bool = True) -> bytes:
    body = _GENLMSGHDR.pack(cmd, 1, 0) + b"".join(_attr(t, p) for t, p in attrs)
    flags = NLM_F_REQUEST | (NLM_F_ACK if ack else 0)
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), family, flags, seq, 0) + body


def family_request(seq: int, name: bytes = TASKSTATS_GENL_NAME) -> bytes:
    return genl_request(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, seq, [(CTRL_ATTR_FAMILY_NAME, name + b"\0")], ack=False)


def cpumask_request(family: int, seq: int, cpus: str, register: bool = True) -> bytes:
    """Ask for (or stop) the exit records of the tasks that exit on ``cpus`` (``0-7``)."""
    attr = TASKSTATS_CMD_ATTR_REGISTER_CPUMASK if register else TASKSTATS_CMD_ATTR_DEREGISTER_CPUMASK
    return genl_request(family, TASKSTATS_CMD_GET, seq, [(attr, cpus.encode() + b"\0")])


def _attrs(data: bytes | bytearray | memoryview, start: int, end: int) -> dict[int, tuple[int, int]]:
    """Attribute type -> (payload start, payload end), for the attributes in [start, end)."""
    out: dict[int, tuple[int, int]] = {}
    while start + _NLATTR.size <= end:
        length, nla_type = _NLATTR.unpack_from(data, start)
        if length < _NLATTR.size or start + length > end:
            break
        out[nla_type & _NLA_TYPE_MASK] = (start + _NLATTR.size, start + length)
        start += (length + 3) & ~3
    return out


def _u32(data: bytes | bytearray | memoryview, span: tuple[int, int] | None) -> int | None:
    if span is None or span[1] - span[0] < 4:
        return None
    return int(struct.unpack_from("=I", data, span[0])[0])


def parse_reply(data: bytes | bytearray | memoryview) -> NetlinkReply | None:
    """An ``NLMSG_ERROR`` (ack or error) or a ``GETFAMILY`` answer; None for anything else."""
    if len(data) < _NLMSGHDR.size:
        return None
    length, msg_type, _flags, seq, _pid = _NLMSGHDR.unpack_from(data)
    if msg_type == NLMSG_ERROR and len(data) >= _NLMSGHDR.size + 4:
        return NetlinkReply(seq, error=struct.unpack_from("=i", data, _NLMSGHDR.size)[0])
    if msg_type == GENL_ID_CTRL:
        span = _attrs(data, _ATTRS_AT, min(length, len(data))).get(CTRL_ATTR_FAMILY_ID)
        if span is not None and span[1] - span[0] >= 2:
            return NetlinkReply(seq, family_id=struct.unpack_from("=H", data, span[0])[0])
    return None


def parse_exit_stats(data: bytes | bytearray | memoryview, family: int) -> ExitStats | None:
    """One taskstats exit record (``TASKSTATS_CMD_NEW`` of ``family``); None for anything
    else, or for a record too short to hold ``hiwater_rss``."""
    if len(data) < _ATTRS_AT:
        return None
    length, msg_type = _NLMSGHDR.unpack_from(data)[:2]
    if msg_type != family or _GENLMSGHDR.unpack_from(data, _NLMSGHDR.size)[0] != TASKSTATS_CMD_NEW:
        return None
    top = _attrs(data, _ATTRS_AT, min(length, len(data)))
    aggr_pid = top.get(TASKSTATS_TYPE_AGGR_PID)
    if aggr_pid is None:
        return None
    inner = _attrs(data, *aggr_pid)
    pid = _u32(data, inner.get(TASKSTATS_TYPE_PID))
    stats = inner.get(TASKSTATS_TYPE_STATS)
    if pid is None or stats is None:
        return None
    start, end = stats
    version = struct.unpack_from("=H", data, start)[0] if end - start >= 2 else 0
    shift = _V15_SHIFT if version == 15 else 0
    if end - start < _HIWATER_RSS + shift + 8:
        return None
    hiwater_kib = struct.unpack_from("=Q", data, start + _HIWATER_RSS + shift)[0]
    comm = bytes(data[start + _COMM + shift:start + _COMM + shift + 32]).split(b"\0", 1)[0]
    uid = struct.unpack_from("=I", data, start + _UID + shift)[0]
    ppid, btime = struct.unpack_from("=II", data, start + _PPID + shift)
    tgid = None
    aggr_tgid = top.get(TASKSTATS_TYPE_AGGR_TGID)
    if aggr_tgid is not None:
        tgid = _u32(data, _attrs(data, *aggr_tgid).get(TASKSTATS_TYPE_TGID))
    return ExitStats(pid, tgid, hiwater_kib * 1024, comm.decode("utf-8", "replace"), version, uid, ppid, btime)
