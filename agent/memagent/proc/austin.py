"""Python stacks sampled at a high rate, with the memory change between samples: an
``austin`` subprocess (the ``austin-dist`` package) attached for a few seconds.

Why Austin and not ``py-spy dump`` for the bursts: a dump is a process start each time
(~13-19 ms of CPU, ~10 % slowdown of an allocating target at 10 dumps a second,
bench/sampler_cost.py), while one Austin attached for a burst samples at 100 Hz for about
nothing (<1 % of a core), never pauses the target (it reads with ``process_vm_readv``, no
ptrace stop) and, in its *full* mode (``-f``), writes with each sample whether the thread
was idle and the process's RSS change since its previous reading. ``py-spy record`` samples
as cheaply but writes nothing until it ends and keeps neither time nor idleness per sample.

Austin's output (``-P``, pipe mode) is one line per thread per sample::

    P<pid>;T<interpreter>:<tid>;<file>:<function>:<line>;... <time_us>,<idle>,<rss_delta>

outermost frame first; metadata lines start with ``#`` (``# memory: <bytes>`` is the RSS
at attach). Austin reads the RSS when it samples the thread that holds the GIL and writes
the change on that thread's line, so the change of one *round* (every thread sampled
once) is the sum over its lines: who made it is decided above
(:meth:`memagent.core.process_stacks.ProcessStacks.record_round`), not by the GIL.

Austin 3.x only: 4.0's binaries need glibc 2.38, newer than the edge boards' (and
Debian 12's). GPL-3.0: it runs as a separate program, never linked.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from memproto.records import StackFrame

from .children import die_with, find_program, kill_and_reap
from .frames import program_frames
from .helper import Charge, Helper, no_charge, spawn

log = logging.getLogger(__name__)

#: Exit status of Austin when the target is not (yet) a Python it recognises.
NOT_PYTHON_STATUS = 32
#: Lines longer than this (a 1000-frame recursion) are skipped, not parsed.
MAX_LINE = 64 * 1024
#: How long Austin may look for the interpreter in a process before giving up.
ATTACH_WAIT = "1s"


def find_austin(explicit: str | None = None) -> str | None:
    return find_program("austin", explicit)


@dataclass(frozen=True, slots=True)
class SampledThread:
    """One thread in one sample: its kernel TID, whether it was running, and its frames as
    Austin wrote them (parsed only when the sample is credited: :func:`parse_frames`)."""

    tid: int
    active: bool
    frames_text: str

    def frames(self) -> list[StackFrame]:
        return parse_frames(self.frames_text)


@dataclass(frozen=True, slots=True)
class SampleRound:
    """Every thread of the process sampled once. ``elapsed``: seconds since Austin
    attached (its own clock, the sum of the sampling intervals); ``rss_change``: bytes the
    RSS moved since the previous round's reading (0 when no thread held the GIL: the
    change then shows in a later round)."""

    elapsed: float
    rss_change: int
    threads: tuple[SampledThread, ...]


@functools.lru_cache(maxsize=4096)
def parse_frames(text: str) -> list[StackFrame]:
    """``file:function:line;...`` (outermost first) as frames innermost first, as py-spy's,
    the program's only (:func:`memagent.proc.frames.program_frames`: a frame Austin could
    not read, ``:INVALID:``, and the import machinery's are left out). Cached: a process's
    stacks repeat, sample after sample."""
    frames = []
    for part in reversed(text.split(";")) if text else ():
        filename, _, rest = part.rpartition(":")
        filename, _, function = filename.rpartition(":")
        frames.append(StackFrame(function or "?", filename or "?", int(rest) if rest.isdigit() else 0))
    return program_frames(frames)


def parse_line(line: str) -> tuple[SampledThread, int, int] | None:
    """One sample line as (thread, interval µs, RSS change); None for metadata, blank or
    malformed lines (skipped: one bad line loses one sample, not the burst)."""
    if not line.startswith("P") or len(line) > MAX_LINE:
        return None
    head, _, metrics = line.rpartition(" ")
    fields = metrics.split(",")
    parts = head.split(";", 2)
    if len(fields) != 3 or len(parts) < 2 or not parts[1].startswith("T"):
        return None
    try:
        tid = int(parts[1].rpartition(":")[2])
        interval, idle, change = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return None
    return SampledThread(tid, idle == 0, parts[2] if len(parts) > 2 else ""), interval, change


class RoundParser:
    """Austin's lines -> :class:`SampleRound`: a round ends where a thread seen in it comes
    again (Austin samples the threads in the same order each time)."""

    def __init__(self) -> None:
        self.start_rss: int | None = None
        self.elapsed_us = 0
        self._threads: list[SampledThread] = []
        self._seen: set[int] = set()
        self._interval = 0
        self._change = 0

    def feed(self, line: str) -> Iterator[SampleRound]:
        if line.startswith("# memory:"):
            with contextlib.suppress(ValueError):
                self.start_rss = int(line.split(":", 1)[1])
            return
        parsed = parse_line(line)
        if parsed is None:
            return
        thread, interval, change = parsed
        if thread.tid in self._seen:
            yield self._close()
        self._threads.append(thread)
        self._seen.add(thread.tid)
        self._interval = max(self._interval, interval)
        self._change += change

    def flush(self) -> Iterator[SampleRound]:
        if self._threads:
            yield self._close()

    def _close(self) -> SampleRound:
        self.elapsed_us += self._interval
        done = SampleRound(self.elapsed_us / 1e6, self._change, tuple(self._threads))
        self._threads, self._seen, self._interval, self._change = [], set(), 0, 0
        return done


@dataclass(frozen=True, slots=True)
class BurstEnd:
    """How a burst ended: ``rounds`` read; ``not_python``: Austin did not find an
    interpreter (too young, not Python, unsupported); ``error``: a one-line reason."""

    rounds: int
    not_python: bool = False
    error: str | None = None


async def sample(austin: str, pid: int, seconds: float, interval_ms: int,
                 on_round: Callable[[SampleRound, int | None], None], charge: Charge = no_charge,
                 on_start: Callable[[Helper], None] | None = None) -> BurstEnd:
    """Run Austin on ``pid`` for ``seconds`` at one sample each ``interval_ms``, calling
    ``on_round(round, rss_at_attach)`` as each round arrives. Line-buffered through
    ``stdbuf`` where there is one, so rounds arrive as they are taken (else in 4 KiB blocks,
    ~0.1 s late). Killed when cancelled, and with the agent (``PR_SET_PDEATHSIG``).
    ``charge``: told the CPU of the run (Austin's own, from its rusage at reap and
    :meth:`Helper.poll_cpu` meanwhile) and the daemon's thread time reading its lines and
    crediting its rounds (``on_round`` included). ``on_start``: told the running helper
    once it runs (``stdbuf`` execs Austin: the same PID), to poll its CPU."""
    argv = [austin, "-f", "-P", "-i", f"{interval_ms}ms", "-x", f"{max(1, round(seconds))}",
            "-t", ATTACH_WAIT, "-p", str(pid)]
    stdbuf = shutil.which("stdbuf")
    if stdbuf is not None:
        argv = [stdbuf, "-oL", *argv]
    try:
        proc = await spawn(argv, charge, preexec_fn=die_with(os.getpid()), limit=MAX_LINE * 2)
    except OSError as exc:
        return BurstEnd(0, error=f"cannot run austin: {exc.strerror}")
    if on_start is not None:
        on_start(proc)
    parser, rounds = RoundParser(), 0
    try:
        while True:
            try:
                raw = await proc.stdout.readline()
            except ValueError:  # a line over the limit: dropped by the reader, and skipped
                continue
            if not raw:
                break
            started = time.thread_time()
            for done in parser.feed(raw.decode("utf-8", "replace").rstrip("\n")):
                rounds += 1
                on_round(done, parser.start_rss)
            charge(time.thread_time() - started, 0.0)
        for done in parser.flush():
            rounds += 1
            on_round(done, parser.start_rss)
        err = await proc.stderr.read(4096)
        status = await proc.wait()
    except asyncio.CancelledError:
        await kill_and_reap(proc)
        raise
    finally:
        proc.close()
    if status == 0 or rounds:
        return BurstEnd(rounds)
    first = next((ln.strip() for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()), "")
    if status == NOT_PYTHON_STATUS:
        return BurstEnd(0, not_python=True, error="austin found no Python interpreter in it")
    return BurstEnd(0, error=f"austin exited with status {status}" + (f": {first[:200]}" if first else ""))
