"""The writer of a client's recording (``memagent record -o FILE``, ``memagent run --record``):
one segment in the flight recorder's format (docs/recording.md) of what one subscribed
client may see (the daemon filters).

The file is one segment (``source: "client"``, sequence 0): the header, an ``attached``
frame per process listed, a headroom snapshot, then every event and sample the
subscription brings (samples with only their changed rows), a batch about every second,
a headroom snapshot (and the stack at each process's new peak, where the daemon has one)
about every 10 s and at the end. It is written as it goes, never rewritten: after a kill
it reads back up to the last batch written, and a reader skips an incomplete last frame.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from memproto.client_side import ConnectionLost, DaemonTimeout, RequestFailed
from memproto.frames import AlertRaised, Attached, Detached, Dropped, Exited, Frame, Sample, StackStateChanged
from memproto.recording import FORMAT_VERSION, HeadroomSnapshot, PeakStack, SegmentHeader, SegmentWriter
from memproto.records import DaemonStatus, ProcessInfo
from memproto.vocabulary import StackState

from ..client import Client, connect
from ..errors import CANNOT_WRITE, CommandFailed
from ..prose import human_bytes

#: Seconds between two batches written, and between two headroom snapshots.
FLUSH_EVERY = 1.0
SNAPSHOT_EVERY = 10.0
#: How long one wait for a frame lasts (the loop then flushes, checks the clock and signals).
WAKE = 0.25
REQUEST_TIMEOUT = 10.0
#: Stack states in which asking for the stack at the peak is pointless.
NO_STACK = frozenset({StackState.NOT_PYTHON, StackState.DENIED, StackState.MISSING, StackState.UNSUPPORTED,
                      StackState.DISABLED})

#: ``--json`` error code of an output that exists (the client's own: hyphens, docs/cli.md), and its
#: exit status: a usage error's (2), since ``--force`` would have done it.
FILE_EXISTS = "file-exists"
FILE_EXISTS_STATUS = 2

class RecordFailed(CommandFailed):
    """The recording cannot go on, or cannot begin."""


@dataclass
class Counts:
    frames: int = 0
    samples: int = 0
    processes: set[tuple[int, float]] = field(default_factory=set)


def check_output(path: str, force: bool) -> None:
    """Refuse now, before connecting, what :func:`create` would refuse."""
    if os.path.isdir(path):
        raise RecordFailed(CANNOT_WRITE, f"cannot write {path}: it is a directory")
    if os.path.lexists(path) and not force:
        raise RecordFailed(FILE_EXISTS, f"{path} exists (--force overwrites it)", FILE_EXISTS_STATUS)


def create(path: str, force: bool) -> int:
    """The output's descriptor, created now (before the first frame). Not over an existing
    file without ``force``; never through a symbolic link planted where a new file goes."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_TRUNC if force else os.O_EXCL)
    try:
        return os.open(path, flags, 0o666)
    except FileExistsError:
        raise RecordFailed(FILE_EXISTS, f"{path} exists (--force overwrites it)", FILE_EXISTS_STATUS) from None
    except OSError as exc:
        raise RecordFailed(CANNOT_WRITE, f"cannot write {path}: {exc.strerror or exc}") from None


class RecordingWriter:
    """One client's recording in progress: a subscribed client, a segment writer, a file."""

    def __init__(self, client: Client, fd: int, path: str, pids: list[int], command: list[str] | None = None) -> None:
        self.client, self.fd, self.path = client, fd, path
        #: ``memagent run``'s CMD, written in the header (the recording's title).
        self.command = command
        self.pids = set(pids)
        self.counts = Counts()
        self.writer: SegmentWriter | None = None
        self._peaks: dict[tuple[int, float], int] = {}  # the highest peak seen per process
        self._asked: dict[tuple[int, float], int] = {}  # the peak at the last stack asked for
        self._stack_times: dict[tuple[int, float], float] = {}
        self._no_stack: set[tuple[int, float]] = set()

    def wants(self, pid: int | None) -> bool:
        return not self.pids or pid is None or pid in self.pids

    def begin(self) -> None:
        """Subscribe, then take what ``list`` and ``status`` say: events that come meanwhile
        wait in the client and follow in order."""
        c = self.client
        c.subscribe()
        processes = c.list()
        status = c.status()
        hello = c.server_hello
        header = SegmentHeader(format=FORMAT_VERSION, host=socket.gethostname(), start_time=time.time(),
                               interval=hello.interval or status.interval, version=list(hello.version),
                               software=status.software, source="client", pid=status.pid,
                               mem_total_bytes=status.host.total_bytes, sequence=0, command=self.command)
        self.writer = SegmentWriter(header)
        self._write(self.writer.header_bytes())
        for p in processes:
            if self.wants(p.pid):
                self._attached(p)
                self._add(Attached(p))
        self._add(HeadroomSnapshot(time.time(), status.host, status.headroom))
        self.flush()

    def _attached(self, p: ProcessInfo) -> None:
        key = (p.pid, p.start_time)
        self.counts.processes.add(key)
        self._peaks[key] = max(self._peaks.get(key, 0), p.rss_peak_bytes)
        if p.stack_state in NO_STACK:
            self._no_stack.add(key)

    def _add(self, frame: Frame) -> None:
        assert self.writer is not None
        self.writer.add(frame)
        self.counts.frames += 1

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
            except OSError as exc:
                raise RecordFailed(CANNOT_WRITE, f"cannot write {self.path}: {exc.strerror or exc}; it holds "
                                   "what came before") from None
            view = view[n:]

    def flush(self) -> None:
        assert self.writer is not None
        self._write(self.writer.take())

    def on_frame(self, frame: Frame) -> None:
        if isinstance(frame, Sample):
            self._sample(frame)
        elif isinstance(frame, Attached):
            if self.wants(frame.process.pid):
                self._attached(frame.process)
                self._add(frame)
        elif isinstance(frame, (Exited, Detached, StackStateChanged)):
            if self.wants(frame.pid):
                if isinstance(frame, StackStateChanged) and frame.state in NO_STACK:
                    self._no_stack.add((frame.pid, frame.start_time))
                self._add(frame)
        elif isinstance(frame, AlertRaised):
            if self.wants(frame.alert.pid):
                self._add(frame)
        elif isinstance(frame, Dropped):
            self._add(frame)  # this client was too slow: samples are missing here

    def _sample(self, frame: Sample) -> None:
        assert self.writer is not None
        fields = list(frame.fields)
        pid_at, start_at, peak_at = (fields.index(name) for name in ("pid", "start_time", "rss_peak_bytes"))
        rows = [r for r in frame.rows if self.wants(r[pid_at])]
        for r in rows:
            key = (r[pid_at], r[start_at])
            self._peaks[key] = max(self._peaks.get(key, 0), r[peak_at])
        self.writer.add_sample(frame.seq, frame.time, frame.interval, rows, fields)
        self.counts.samples += 1
        self.counts.frames += 1

    def snapshot(self) -> None:
        """The headroom now, and the stack at the peak of each process whose peak rose since
        the last time asked (where the daemon has one: it takes them, we only ask)."""
        c = self.client
        c.set_timeout(REQUEST_TIMEOUT)
        try:
            status: DaemonStatus = c.status()
            self._add(HeadroomSnapshot(time.time(), status.host, status.headroom))
            for key, peak in list(self._peaks.items()):
                if key in self._no_stack or self._asked.get(key) == peak:
                    continue
                self._asked[key] = peak
                try:
                    reply = c.stack(key[0], fresh=False)
                except RequestFailed:
                    continue  # gone from the daemon (detached), or no longer ours to see
                dump = reply.at_peak
                if reply.start_time == key[1] and dump is not None and self._stack_times.get(key) != dump.time:
                    self._stack_times[key] = dump.time
                    self._add(PeakStack(key[0], key[1], dump))
        finally:
            c.set_timeout(WAKE)

    def close(self) -> int:
        """Sync and close the file; its size."""
        try:
            os.fsync(self.fd)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.EROFS):  # a pipe or the like: nothing to sync
                raise RecordFailed(CANNOT_WRITE, f"cannot write {self.path}: {exc.strerror or exc}") from None
        size = os.fstat(self.fd).st_size
        os.close(self.fd)
        return size


def record_until(rec: RecordingWriter, duration: float | None, stopped: Callable[[], bool]) -> str | None:
    """Record until ``duration`` or ``stopped()``; ``None`` when it ended as asked, else why (the
    daemon went away)."""
    c = rec.client
    start = time.monotonic()
    next_flush, next_snapshot = start + FLUSH_EVERY, start + SNAPSHOT_EVERY
    c.set_timeout(WAKE)
    try:
        while not stopped():
            now = time.monotonic()
            if duration is not None and now - start >= duration:
                break
            if now >= next_flush:
                rec.flush()
                next_flush = now + FLUSH_EVERY
            if now >= next_snapshot:
                rec.snapshot()
                next_snapshot = now + SNAPSHOT_EVERY
            try:
                frame = c.events.popleft() if c.events else c.recv()
            except DaemonTimeout:
                continue
            rec.on_frame(frame)
        rec.snapshot()
        return None
    except (ConnectionLost, DaemonTimeout) as exc:
        return f"the daemon went away ({exc})"
    finally:
        rec.flush()


class Stopper:
    """SIGINT and SIGTERM set a flag the loop reads between frames, instead of raising in
    the middle of a write."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Stopper:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._set)
        return self

    def _set(self, sig: int, _frame: FrameType | None) -> None:
        self.signal = sig

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def record(sock: str | None, output: str, force: bool, pids: Sequence[int],
           duration: float | None) -> tuple[dict[str, object], str]:
    """``memagent record``: record what the daemon at ``sock`` sends of ``pids`` (none:
    every process this client may see) to ``output`` until ``duration``, SIGINT or SIGTERM;
    what was written (the ``--json`` object, a line). The daemon gone: :class:`RecordFailed`,
    the file complete up to then."""
    check_output(output, force)
    started = time.monotonic()
    with connect(sock, timeout=REQUEST_TIMEOUT) as client:
        fd = create(output, force)
        rec = RecordingWriter(client, fd, output, list(pids))
        lost: str | None = None
        try:
            with Stopper() as stopper:
                try:
                    rec.begin()
                except (ConnectionLost, DaemonTimeout) as exc:
                    lost = f"the daemon went away ({exc})"
                else:
                    lost = record_until(rec, duration, lambda: stopper.signal is not None)
        finally:
            size = rec.close()
    seconds = round(time.monotonic() - started, 3)
    path = os.path.abspath(output)
    n = rec.counts
    done: dict[str, object] = {"file": path, "seconds": seconds, "frames": n.frames, "samples": n.samples,
                               "processes": len(n.processes), "bytes": size}
    line = (f"{path}: {seconds:.1f} s, {n.samples} samples, {n.frames} frames, {len(n.processes)} "
            f"process{'' if len(n.processes) == 1 else 'es'}, "
            f"{human_bytes(size)}")
    if lost is not None:
        raise RecordFailed(ConnectionLost.code, f"{lost} after {seconds:.1f} s; {path} holds what came before "
                           f"({n.samples} samples)")
    return done, line
