"""Process events from the kernel, no eBPF, no ptrace: two netlink sockets, read without
blocking from the agent's event loop (the caller puts :attr:`ProcessEventSource.fds` on
the loop and calls :meth:`ProcessEventSource.read_pending`).

* The proc connector: every process's ``fork`` and ``exec`` (see
  :mod:`memagent.proc.netlink_msg`), so the agent attaches a followed process's child at
  its first instant and an ``--auto`` match when it starts its program.
* taskstats exit records: every exiting task's final high-water RSS, so a process that
  spikes and exits between two ticks still gets its exact peak.

Both need root (``CAP_NET_ADMIN``) in the initial PID and user namespaces. Where they
cannot be had, :func:`open_source` returns the reason and the agent polls ``/proc``.
Nothing here raises past :func:`open_source`: failures become a reason or a count.

Order matters: a taskstats record is sent in ``do_exit`` before the task drops its memory
map, so by the time ``/proc/PID/statm`` reads as a zombie's (or the PID is gone) the
record is already queued; and a child's fork event is queued before anything the child
does. :meth:`ProcessEventSource.read_pending` therefore reads the taskstats socket
first, then the connector socket: every fork of a process whose exit record it
returns is among the events it returns.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import socket
from dataclasses import dataclass
from typing import Final

from .netlink_msg import (
    NETLINK_CONNECTOR,
    NETLINK_GENERIC,
    PROC_EVENT_EXEC,
    PROC_EVENT_FORK,
    ConnectorAck,
    ExitStats,
    ProcEvent,
    cpumask_request,
    family_request,
    listen_request,
    parse_exit_stats,
    parse_proc_event,
    parse_reply,
)

log = logging.getLogger(__name__)

_BUFFER: Final = 1 << 16
_BATCH: Final = 4096
#: Socket receive buffers (root may exceed net.core.rmem_max): a burst of exits or forks
#: while a tick runs must not overflow them.
_TASKSTATS_RCVBUF: Final = 8 << 20
_CONNECTOR_RCVBUF: Final = 4 << 20
_SETUP_TIMEOUT: Final = 2.0
_POSSIBLE_CPUS: Final = "/sys/devices/system/cpu/possible"
_SO_RCVBUFFORCE: Final = 33  # not in the socket module (asm-generic value)


@dataclass
class ProcessEventSource:
    """The two open sockets; :meth:`read_pending` returns what arrived since last time."""

    connector: socket.socket
    taskstats: socket.socket
    family: int
    cpus: str
    #: Times the taskstats socket overflowed (ENOBUFS): exit records were lost. The kernel
    #: says that some were, not how many nor whose (what the agent makes of it:
    #: memagent.core.process_events).
    record_overruns: int = 0
    #: Times the connector socket overflowed: fork and exec events were lost.
    event_overruns: int = 0

    @property
    def overruns(self) -> int:
        """Both sockets' overflows (``memagent status``)."""
        return self.record_overruns + self.event_overruns

    @property
    def fds(self) -> tuple[int, int]:
        return (self.taskstats.fileno(), self.connector.fileno())

    def read_pending(self) -> tuple[list[ProcEvent], list[ExitStats]]:
        """Everything queued: exit records first read, then events (see the module doc)."""
        exits: list[ExitStats] = []
        family = self.family
        for data in self.receive(self.taskstats):
            record = parse_exit_stats(data, family)
            if record is not None:
                exits.append(record)
        events: list[ProcEvent] = []
        for data in self.receive(self.connector):
            event = parse_proc_event(data)
            if isinstance(event, ProcEvent):
                events.append(event)
        return events, exits

    def receive(self, sock: socket.socket, limit: int = _BATCH) -> list[bytes]:
        """The raw datagrams queued on one of its sockets, from the kernel only (a root
        process could send some too), at most ``limit`` at once: a flood of forks never
        holds the loop for long; the rest is read on its next turn."""
        out: list[bytes] = []
        while len(out) < limit:
            try:
                data, (sender, _groups) = sock.recvfrom(_BUFFER)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    # Reported once, before the messages still queued (those older than the
                    # loss); reading goes on with them.
                    if sock is self.taskstats:
                        self.record_overruns += 1
                    else:
                        self.event_overruns += 1
                    total = self.overruns
                    if total & (total - 1) == 0:  # 1, 2, 4, 8...: not a log flood
                        log.warning("process events lost: netlink socket overrun (%d so far)", total)
                    continue
                if exc.errno == errno.EINTR:
                    continue
                log.warning("process events: %s", exc)
                break
            if sender == 0 and data:
                out.append(data)
        return out

    def close(self) -> None:
        try:
            self.taskstats.send(cpumask_request(self.family, 0, self.cpus, register=False))
        except OSError:
            pass
        self.taskstats.close()
        self.connector.close()


def _possible_cpus() -> str:
    try:
        with open(_POSSIBLE_CPUS) as f:
            cpus = f.read().strip()
        if cpus:
            return cpus
    except OSError:
        pass
    return f"0-{(os.cpu_count() or 1) - 1}"


class _Refused(Exception):
    """Why the kernel will not tell us, in words.

    Control flow private to this module, not an error of the tree: the openers raise it
    and :func:`open_source` turns it into its reason (``None, "taskstats: ..."``), so it
    never leaves here and no client sees it (hence no ``code``, no :class:`MemagentError`).
    """


_NOT_PERMITTED = "not permitted: needs root (CAP_NET_ADMIN)"
_NAMESPACED = "refused: the daemon is not in the initial PID and user namespaces (a container?)"


def _exchange(sock: socket.socket, request: bytes, seq: int) -> tuple[int, int | None]:
    """Send a request and read its answer: (error, family id). Raises OSError, TimeoutError."""
    sock.send(request)
    while True:
        data = sock.recv(_BUFFER)
        reply = parse_reply(data)
        if reply is not None and reply.seq == seq:
            return reply.error, reply.family_id


def _open_taskstats() -> tuple[socket.socket, int, str]:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_GENERIC)
    try:
        sock.bind((0, 0))
        sock.settimeout(_SETUP_TIMEOUT)
        seq = random.randrange(1, 1 << 30)
        error, family = _exchange(sock, family_request(seq), seq)
        if family is None:
            raise _Refused("not in this kernel (no TASKSTATS generic netlink family)")
        cpus = _possible_cpus()
        error, _ = _exchange(sock, cpumask_request(family, seq + 1, cpus), seq + 1)
        if error in (-errno.EPERM, -errno.EACCES):
            raise _Refused(_NOT_PERMITTED)
        if error == -errno.EINVAL:  # what it answers outside the initial namespaces
            raise _Refused(_NAMESPACED)
        if error:
            raise _Refused(f"exit records refused: {os.strerror(-error)}")
        _force_rcvbuf(sock, _TASKSTATS_RCVBUF)
        sock.setblocking(False)
        return sock, family, cpus
    except BaseException:
        sock.close()
        raise


def _open_connector() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_CONNECTOR)
    try:
        _force_rcvbuf(sock, _CONNECTOR_RCVBUF)
        sock.bind((0, 1))  # the CN_IDX_PROC multicast group
        sock.setblocking(False)
        ack = random.randrange(1, 1 << 30)
        sock.send(listen_request(ack))
        # The kernel handles the request while we send it: its ack is queued already,
        # unless it ignored the request (a process outside the initial namespaces).
        while True:
            try:
                event = parse_proc_event(sock.recv(_BUFFER))
            except BlockingIOError:
                raise _Refused(_NAMESPACED) from None
            if isinstance(event, ConnectorAck) and event.ack == ack + 1:
                if event.err in (errno.EPERM, errno.EACCES):
                    raise _Refused(_NOT_PERMITTED)
                if event.err:
                    raise _Refused(f"listening refused: {os.strerror(event.err)}")
                break
        # Since Linux 6.6: only fork and exec from now on (older kernels ignore this).
        sock.send(listen_request(ack + 2, PROC_EVENT_FORK | PROC_EVENT_EXEC))
        return sock
    except BaseException:
        sock.close()
        raise


def _force_rcvbuf(sock: socket.socket, size: int) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, size)
    except OSError:  # not root: up to net.core.rmem_max
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)


def open_source() -> tuple[ProcessEventSource | None, str | None]:
    """Both sockets, listening; or None and why not (in words, for ``memagent status``)."""
    try:
        taskstats, family, cpus = _open_taskstats()
    except (_Refused, OSError) as exc:
        return None, f"taskstats: {_why(exc)}"
    try:
        connector = _open_connector()
    except (_Refused, OSError) as exc:
        taskstats.close()
        return None, f"proc connector: {_why(exc)}"
    return ProcessEventSource(connector, taskstats, family, cpus), None


def _why(exc: Exception) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer from the kernel"
    if isinstance(exc, OSError):
        if exc.errno in (errno.EPERM, errno.EACCES):
            return _NOT_PERMITTED
        if exc.errno == errno.EPROTONOSUPPORT:
            return "not in this kernel"
        return exc.strerror or os.strerror(exc.errno or 0)
    return str(exc)
