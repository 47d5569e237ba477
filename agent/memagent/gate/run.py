"""What ``memagent run [--budget-rss SIZE] [--budget-vram SIZE] [--per-process] ... -- CMD ARGS…``
does: run CMD under an embedded agent that watches it and all its descendants, judge their peaks
against a budget, and exit with CMD's status (or 3: over budget).

How CMD is watched from its first instant, without ptrace: a child is forked that waits on
a pipe, the embedded agent attaches it (``children``: its descendants too, from their
fork), then the pipe releases it and it execs CMD. ``memagent run`` is a child subreaper,
so CMD's orphans are reparented to it (and reaped by it) rather than to init. SIGINT,
SIGTERM and SIGHUP are forwarded to CMD (not a terminal's Ctrl-C, which CMD gets itself:
it shares the foreground process group). The figures come over the agent's socket as for
any client (the judge and the outputs: :mod:`.outputs`). The command line and the exit
statuses of its errors: :mod:`memagent.cli.gate_cmd`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from memproto.client_side import ClientError, DaemonTimeout, RequestFailed
from memproto.fold import Fold, Key
from memproto.frames import Frame, Sample
from memproto.records import DaemonStatus, GrowthSite, ProcessInfo, StackDump
from memproto.text import printable
from memproto.vocabulary import Resource

from ..client import Client, connect
from ..errors import MemagentError
from ..prose import human_bytes
from .fits import HOST, FitVerdict, Need, judge
from .outputs import Outcome, ProcessPeak, RunBudget, check_writable, failures, summary_lines, write_outputs

if TYPE_CHECKING:
    from ..recordings.writer import RecordingWriter
    from .run_agent import Child, Sentinel

PROG = "memagent run"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
WATCHED_SIGNALS = {*FORWARDED, signal.SIGCHLD}
#: How long one wait for a frame lasts (signals and CMD's exit are looked at in between).
WAKE = 0.1
#: How long a request to the run's own agent may wait for its answer, in seconds. The agent
#: is a thread of this process: it answers at its next turn of the loop, which a loaded box
#: delays by seconds, not minutes (a fixed 10 s failed runs before CMD started, issue 26).
AGENT_ANSWERS_WITHIN = 120.0
#: Ticks of the agent within which it tells CMD's exit (it notices an exit at its next tick,
#: or at once by the kernel's event): past them the figures are taken as they are.
EXIT_SEEN_WITHIN = 3
#: ``si_code`` of a signal the kernel sent (a terminal's Ctrl-C: CMD got it too).
SI_KERNEL = 0x80


class AgentSilent(MemagentError):
    """The run's own agent (a thread of ``memagent run``) gave no answer in time."""

class Watch:
    """What the stream says while CMD runs: the tree, the peaks, the stacks at the peaks.

    The figures are :class:`memproto.fold.Fold`'s, per (PID, start time): a PID the kernel
    reuses within the tree is a second process whose peak counts beside the first's, not
    one that a max() would merge with it."""

    def __init__(self, client: Client, budget: RunBudget, recording: RecordingWriter | None,
                 sentinel: Sentinel | None = None) -> None:
        self.client, self.budget, self.recording, self.sentinel = client, budget, recording, sentinel
        self.fold = Fold()
        self.samples = 0
        #: The stack at the peak, by process (the reply says which one it is).
        self.stacks: dict[Key, StackDump] = {}
        self.sites: dict[tuple[str, str], GrowthSite] = {}
        self._asked: dict[Key, int] = {}

    @property
    def tree(self) -> set[int]:
        """The PIDs of CMD's tree seen so far (the kernel's view: who to reap)."""
        return {pid for pid, _ in self.fold.processes}

    @property
    def alive(self) -> set[int]:
        return {f.pid for f in self.fold.processes.values() if f.alive}

    @property
    def peaks(self) -> dict[Key, int]:
        return {key: f.rss_peak_bytes for key, f in self.fold.processes.items()}

    @property
    def vram(self) -> dict[Key, int]:
        return {key: f.vram_peak_bytes for key, f in self.fold.processes.items() if f.vram_peak_bytes is not None}

    @property
    def exited(self) -> set[Key]:
        """The processes whose exit record came."""
        return {key for key, f in self.fold.processes.items() if f.exit_seen}

    def on_frame(self, frame: Frame) -> None:
        if self.recording is not None:
            self.recording.on_frame(frame)
        self.fold.apply(frame)
        if isinstance(frame, Sample):
            self.samples += 1
            if self.sentinel is not None:
                self.sentinel.tell(self.fold.processes)

    def raw_over(self) -> bool:
        """Over budget on the raw peaks (an upper bound of the share-adjusted Σ)."""
        b, peaks, vram = self.budget, self.peaks, self.vram
        if b.per_process:
            return (b.rss is not None and max(peaks.values(), default=0) > b.rss) or \
                   (b.vram is not None and max(vram.values(), default=0) > b.vram)
        return (b.rss is not None and sum(peaks.values()) > b.rss) or \
               (b.vram is not None and sum(vram.values()) > b.vram)

    def adjusted_sum(self, status: DaemonStatus | None = None) -> int:
        """The agent's Σ of share-adjusted peaks (its host headroom), else Σ of RSS peaks."""
        status = status or self.client.status()
        host = next((h for h in status.headroom if h.resource == HOST), None)
        return host.sum_peaks_bytes if host is not None else sum(self.peaks.values())

    def ask_stacks(self) -> None:
        """The stack at the peak of each process whose peak rose since last asked (kept,
        since an exited process's may no longer be asked for). The daemon is asked by PID:
        its reply says which process it answers for, and is kept under that one."""
        for key, peak in self.peaks.items():
            if self._asked.get(key) == peak:
                continue
            self._asked[key] = peak
            try:
                reply = self.client.stack(key[0], fresh=False)
            except RequestFailed:
                continue
            if reply.at_peak is not None:
                self.stacks[(reply.pid, reply.start_time)] = reply.at_peak
            # A function's line: the one of its lines credited most (by_line, most first),
            # where the wire's by-function table has none.
            lines: dict[tuple[str, str], int | None] = {}
            for s in reply.by_line:
                lines.setdefault((s.function, s.filename), s.line)
            for s in reply.by_function:
                self.sites[(s.function, s.filename)] = replace(s, line=lines.get((s.function, s.filename), s.line))


def _wait_frames(client: Client, watch: Watch, until: Callable[[], bool], ticks: int) -> None:
    """Read frames until ``until()`` or for ``ticks`` more of the agent's samples: counted in
    its own clock, so a loaded box that slows its ticks waits as long in ticks (a stalled
    agent still ends the wait, after :data:`AGENT_ANSWERS_WITHIN`)."""
    last = watch.samples + ticks
    deadline = time.monotonic() + AGENT_ANSWERS_WITHIN
    while not until() and watch.samples < last and time.monotonic() < deadline:
        try:
            watch.on_frame(client.events.popleft() if client.events else client.recv())
        except DaemonTimeout:
            continue


def _signals(child: Child) -> None:
    """Forward what came for us to CMD (but a terminal's signal, which its group got)."""
    while (info := signal.sigtimedwait(WATCHED_SIGNALS, 0)) is not None:
        if info.si_signo != signal.SIGCHLD and child.wait_status is None:
            from_terminal = info.si_code == SI_KERNEL and os.getpgid(child.pid) == os.getpgrp()
            if not from_terminal:
                os.kill(child.pid, info.si_signo)


def _kill_tree(child: Child, watch: Watch | None) -> None:
    """SIGKILL CMD and what the agent saw alive of its tree."""
    for pid in {child.pid} | (watch.alive if watch is not None else set()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _frame_or_exit(client: Client, child: Child) -> bool:
    """Wait up to :data:`WAKE` for the agent's socket or CMD's exit; whether the socket
    has something to read (else CMD exited, a signal may wait, or the time is up)."""
    if child.exit_fd is None:  # no pidfd: recv's own timeout is the wait
        return True
    readable, _, _ = select.select([client.fileno(), child.exit_fd], [], [], WAKE)
    return client.fileno() in readable


def supervise(client: Client, child: Child, watch: Watch, args: argparse.Namespace,
              before_reap: Callable[[], None]) -> bool:
    """Follow the stream until CMD exits (``before_reap()`` then, while it is a zombie);
    whether it was killed for its budget."""
    started = time.monotonic()
    next_progress = started + 1.0
    next_stacks = started + 0.5
    killed = False
    client.set_timeout(WAKE)
    while True:
        _signals(child)
        child.reap_orphans(watch.tree)
        if child.exited():
            before_reap()
            child.reap()
            return killed
        if not (client.events or client.buffered) and not _frame_or_exit(client, child):
            continue
        try:
            frame = client.events.popleft() if client.events else client.recv()
        except DaemonTimeout:
            continue
        watch.on_frame(frame)
        if not isinstance(frame, Sample):
            continue
        now = time.monotonic()
        if args.kill_over_budget and not killed and watch.raw_over():
            if args.per_process or args.budget_vram is not None or watch.adjusted_sum() > (args.budget_rss or 0):
                killed = True
                _kill_tree(child, watch)
        if now >= next_stacks:
            watch.ask_stacks()
            next_stacks = now + 0.5
        if watch.recording is not None:
            watch.recording.flush()
        if args.progress and now >= next_progress:
            budget = f" / {human_bytes(args.budget_rss)}" if args.budget_rss is not None else ""
            print(f"memagent run: {now - started:6.1f} s  Σ peak {human_bytes(sum(watch.peaks.values()))}"
                  f"{budget}  {len(watch.alive)} running", file=sys.stderr, flush=True)
            next_progress = now + 1.0


@dataclass
class Figures:
    """What the agent says once CMD has exited."""

    total: int
    processes: list[ProcessPeak]
    sites: list[GrowthSite]
    #: What the run needs on each resource (``--fits``): its Σ on the host and each GPU it used.
    needs: list[Need]
    #: PID -> start time of the tree's processes (to know them in the daemon's list).
    starts: dict[int, float]
    #: What the agent could not do (no stacks, no process events), for the summary.
    notes: list[str]


def finish(client: Client, child: Child, watch: Watch) -> Figures:
    """After CMD's exit: its exit record, a tick after it, the figures."""
    _wait_frames(client, watch, lambda: any(pid == child.pid for pid, _ in watch.exited), EXIT_SEEN_WITHIN)
    seen = watch.samples
    _wait_frames(client, watch, lambda: watch.samples > seen, 1)
    client.set_timeout(AGENT_ANSWERS_WITHIN)
    watch.ask_stacks()
    status = client.status()
    total = watch.adjusted_sum(status)
    cmd = min((key for key in watch.fold.processes if key[0] == child.pid), key=lambda key: key[1], default=None)
    infos = [_named(p, cmd, child.argv) for p in client.list() if (p.pid, p.start_time) in watch.fold.processes]
    processes = [ProcessPeak.of(p, watch.stacks.get((p.pid, p.start_time))) for p in infos]
    sites = sorted(watch.sites.values(), key=lambda s: -s.bytes)[:10]
    gpus = [Need(h.resource, h.sum_peaks_bytes) for h in status.headroom
            if h.resource != HOST and not h.resource.startswith(Resource.CGROUP_PREFIX) and h.sum_peaks_bytes]
    notes = [f"no Python stacks: {status.stack_note}"] if status.stack_note else []
    if status.process_events != "netlink":
        notes.append(f"no kernel process events ({status.process_events_note or 'polling'}): a descendant "
                     "living under a second may be unseen (the kernel's wait4 peak stands in)")
    return Figures(total, processes, sites, [Need(HOST, total), *gpus], {p.pid: p.start_time for p in infos}, notes)


def _named(p: ProcessInfo, cmd: Key | None, argv: list[str]) -> ProcessInfo:
    """``p``; CMD itself (``cmd``, the first process of its PID) with the command line we
    exec'd where the agent has none: a command that ends within a millisecond of its
    ``exec`` may be a zombie before the agent reads it (an empty ``/proc/PID/cmdline``)."""
    if p.cmdline or (p.pid, p.start_time) != cmd:
        return p
    return replace(p, cmdline=list(argv))


def ask_fits(socket: str | None, figures: Figures) -> list[FitVerdict]:
    """The daemon's verdict on the run's needs (``--fits``). What the daemon watches of the
    run itself (its auto-attach patterns may match it) is taken out of its Σ, as its RSS
    peak (an upper bound of its share-adjusted part). A daemon gone: nothing can be judged."""
    try:
        with connect(socket) as daemon:
            status = daemon.status()
            ours = [p for p in daemon.list() if abs(figures.starts.get(p.pid, -1.0) - p.start_time) < 0.05]
    except ClientError as exc:
        print(f"{PROG}: --fits: cannot ask the daemon: {printable(str(exc))}", file=sys.stderr)
        return [FitVerdict(n.resource, n.resource, n.bytes, None, 0) for n in figures.needs]
    return judge(figures.needs, status.headroom, {HOST: sum(p.rss_peak_bytes for p in ours)})


@contextlib.contextmanager
def _own_agent() -> Iterator[None]:
    """A request to the run's own agent that got no answer names that agent, not a daemon
    at a temporary path the user never started."""
    try:
        yield
    except DaemonTimeout:
        raise AgentSilent(f"its own agent gave no answer within {AGENT_ANSWERS_WITHIN:g} s") from None


def exit_status(outcome: Outcome, budget: RunBudget, over_budget_status: int) -> int:
    """The verdict: ``over_budget_status`` when the tree went over its budget (or was killed
    for it, or would not fit), else CMD's own exit status; CMD that could not be executed
    keeps its 126/127 whatever its peaks."""
    over = bool(failures(outcome, budget)) or outcome.killed
    return over_budget_status if over and outcome.exec_error is None else outcome.status


def run_command(argv: list[str], args: argparse.Namespace) -> int:
    """Run ``argv`` (CMD and its arguments, none empty: the command's check) under the
    budget and options of ``args`` (``memagent run``'s), print its summary on stderr and
    write its outputs; the exit status (:func:`exit_status`)."""
    if args.record:  # the writer (and the recording's format): only for --record
        from ..recordings.writer import check_output

        check_output(args.record, False)
    for path in (args.report, args.junit):
        if path:
            check_writable(path)
    if args.fits:  # no daemon to ask: refused before CMD runs
        with connect(args.socket) as daemon:
            daemon.status()
    budget = RunBudget(args.budget_rss, args.budget_vram, args.per_process)
    from .run_agent import Child, RunAgent, Sentinel, become_subreaper, mark_as_gate  # the agent: only here

    become_subreaper()
    mark_as_gate()  # before CMD is forked: any descendant can tell a run watches it (marks.py)
    # The agent's warnings (no py-spy, no process events) would print while CMD runs: they
    # come in the summary instead (Figures.notes); its errors still show.
    logging.getLogger("memagent").setLevel(logging.ERROR)
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED_SIGNALS)
    sentinel = Sentinel()  # before CMD and the agent's thread: it kills the tree if we are SIGKILLed
    child = Child(argv, set(old_mask))
    agent: RunAgent | None = None
    watch: Watch | None = None
    try:
        agent = RunAgent(args.interval)
        agent.start()
        with _own_agent(), Client(agent.socket, timeout=AGENT_ANSWERS_WITHIN) as client:
            client.subscribe()
            agent.attach_before_exec(child.pid)  # no label: each process is named by its own command
            recording = None
            if args.record:
                from ..recordings.writer import RecordingWriter, create

                recording = RecordingWriter(client, create(args.record, False), args.record, [], command=argv)
                recording.begin()
            watch = Watch(client, budget, recording, sentinel)
            exec_error = child.release()
            started = time.monotonic()
            killed = supervise(client, child, watch, args, agent.take_events)
            duration = time.monotonic() - started
            agent.tick_now()  # CMD is reaped: the tick that tells its exit, now
            figures = finish(client, child, watch)
            if recording is not None:
                recording.snapshot()
                recording.flush()
                recording.close()
    finally:
        if not child.released:  # the agent failed before CMD was released: it never runs
            child.abandon()
        elif child.wait_status is None:  # the gate fails while CMD runs: it must not run on unwatched
            _kill_tree(child, watch)
            child.reap(block=True)
        if agent is not None:
            agent.stop()
        sentinel.done()
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    if exec_error is not None:
        print(f"{PROG}: {printable(argv[0])}: {'command not found' if child.exit_code == 127 else exec_error}",
              file=sys.stderr)
    kernel = child.kernel_peak if exec_error is None else None
    outcome = Outcome(argv, child.exit_code, duration, max(figures.total, kernel or 0), figures.processes,
                      figures.sites, exec_error, killed, kernel_max_rss=kernel, notes=figures.notes)
    if args.fits and exec_error is None:
        outcome.fits, outcome.fits_basis = ask_fits(args.socket, figures), args.basis
    status = exit_status(outcome, budget, args.over_budget_status)
    if exec_error is None:
        for line in summary_lines(outcome, budget, status):
            print(line, file=sys.stderr)
    problems = write_outputs(outcome, budget, status, args.report, args.junit)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems and status == 0 else status  # an output not written fails a run that passed


