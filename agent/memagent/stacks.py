"""Python stacks from outside with ``py-spy dump --nonblocking``: when to take them, what
they tell, and what the user sees when they cannot be had.

py-spy reads the target interpreter's memory with ``process_vm_readv``; with
``--nonblocking`` it never stops the target (no ptrace attach). Never ``--native`` (it
cannot be combined with ``--nonblocking``) and never ``--locals`` (locals can hold
secrets). Each dump is a subprocess with a timeout; a hanging py-spy is killed.

**When** (:class:`StackCollector`), all under one global budget (a token bucket, default
4 dumps/s for the whole box, so 100 growing processes never mean 100 dumps a second):
a process's memory rose by more than ``growth_threshold`` since the last tick, or it set
a new peak; on demand (``memagent stack PID``, memtop's selected process); and a slow
rotation so every watched Python process has a recent stack.

**Attribution**: every positive RSS/VRAM delta between ticks waits in the process's
pending growth; the next stack taken gets it, credited to the innermost frame of the
attributed thread and aggregated by line and by function (the lines of one function
together). This is correlation from sampling: see ``docs/stacks.md``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memproto.records import GrowthSite, StackDump, StackFrame, ThreadStack

log = logging.getLogger(__name__)

MiB = 1024 * 1024

OK = "ok"
PENDING = "pending"
NOT_PYTHON = "not_python"
DENIED = "permission_denied"
MISSING = "py_spy_missing"
UNSUPPORTED = "unsupported"
EXITED = "exited"
TIMEOUT = "timeout"
ERROR = "error"
DISABLED = "disabled"

#: What the user can do about each state.
ADVICE = {
    NOT_PYTHON: "not a Python process (or its interpreter is not recognised)",
    DENIED: "permission denied: run the daemon as root or with CAP_SYS_PTRACE",
    MISSING: "py-spy not found: install it (pip install py-spy) or pass --py-spy PATH",
    UNSUPPORTED: "this Python version is not supported by the installed py-spy",
    EXITED: "the process exited",
    TIMEOUT: "py-spy did not answer in time and was killed",
}

#: Priorities: lower runs first.
DEMAND, PEAK, GROWTH, ROTATION = 0, 1, 2, 3
TRIGGER_NAMES = {DEMAND: "demand", PEAK: "peak", GROWTH: "growth", ROTATION: "rotation"}
MAX_SITES = 200


@dataclass
class StackConfig:
    enabled: bool = True
    #: Dumps per second for the whole box, and how many may be taken at once after a lull.
    budget: float = 4.0
    burst: int = 4
    #: py-spy processes running at the same time, at most.
    concurrency: int = 2
    timeout: float = 2.0
    #: Growth between two ticks (RSS + VRAM) that triggers a dump.
    growth_threshold: int = 32 * MiB
    #: Every watched Python process gets a stack at least this often.
    rotation: float = 30.0
    #: py-spy executable; None: look on PATH, then beside this Python.
    py_spy: str | None = None


def find_py_spy(explicit: str | None = None) -> str | None:
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("py-spy")
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else None


def classify_failure(stderr: str, pid_alive: bool) -> tuple[str, str]:
    """A failed dump's state and a one-line message, from py-spy's stderr."""
    text = stderr.strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "py-spy failed")
    lower = text.lower()
    # Permission first: py-spy's message for a process it may not read also says "check
    # that the process is running" (root without CAP_SYS_PTRACE, in a container).
    if pid_alive and ("permission denied" in lower or "operation not permitted" in lower):
        return DENIED, ADVICE[DENIED]
    if not pid_alive or "no such process" in lower or "check that the process is running" in lower:
        return EXITED, ADVICE[EXITED]
    if "failed to find python version" in lower or "doesn't look like a python" in lower:
        return NOT_PYTHON, ADVICE[NOT_PYTHON]
    if "unsupported" in lower and "version" in lower:
        return UNSUPPORTED, f"{ADVICE[UNSUPPORTED]} ({first.removeprefix('Error: ')})"
    return ERROR, first.removeprefix("Error: ")[:300]


def parse_dump(data: bytes, now: float, trigger: str, rss: int, vram: int | None) -> StackDump:
    """py-spy's JSON (a list of threads) as a :class:`StackDump`; raises ValueError."""
    raw = json.loads(data)
    if not isinstance(raw, list):
        raise ValueError("py-spy JSON is not a list of threads")
    threads = []
    for t in raw:
        frames = [
            StackFrame(str(f.get("name", "?")), str(f.get("filename", "?")), int(f.get("line") or 0))
            for f in t.get("frames", [])
        ]
        name = t.get("thread_name")
        threads.append(ThreadStack(int(t.get("thread_id", 0)), None if name is None else str(name),
                                   bool(t.get("active")), bool(t.get("owns_gil")), frames))
    chosen = attributed_thread(threads)
    return StackDump(now, trigger, rss, vram, threads, chosen.thread_id if chosen else None)


def attributed_thread(threads: list[ThreadStack]) -> ThreadStack | None:
    """The thread growth is attributed to: the active one holding the GIL, else any active
    one, else the main thread, else the first."""
    with_frames = [t for t in threads if t.frames]
    picks: list[Callable[[ThreadStack], bool]] = [
        lambda t: t.active and t.owns_gil,
        lambda t: t.active,
        lambda t: t.name == "MainThread",
    ]
    for pick in picks:
        for t in with_frames:
            if pick(t):
                return t
    return with_frames[0] if with_frames else None


class ProcessStacks:
    """Stacks and attribution of one watched process."""

    __slots__ = ("at_peak", "at_peak_rss", "by_function", "by_line", "last_request", "last_taken", "latest",
                 "message", "pending_growth", "prev_total", "state")

    def __init__(self) -> None:
        self.state: str | None = None
        self.message: str | None = None
        self.latest: StackDump | None = None
        self.at_peak: StackDump | None = None
        self.at_peak_rss = -1
        self.pending_growth = 0
        self.prev_total: int | None = None
        self.by_line: dict[tuple[str, str, int], list[int]] = {}
        self.by_function: dict[tuple[str, str], list[int]] = {}
        self.last_taken = 0.0
        self.last_request = 0.0

    def record(self, dump: StackDump) -> None:
        """A new dump: the latest; the stack at peak if taken at the highest RSS so far; and
        the growth pending since the previous dump is attributed to it."""
        self.latest = dump
        self.last_taken = dump.time
        # Replaced only by a dump at clearly more memory (1%, at least 1 MiB): at a plateau
        # the first stack taken there is the one closest to reaching it.
        total = dump.rss_bytes + (dump.vram_bytes or 0)
        if self.at_peak is None or total > self.at_peak_rss + max(MiB, self.at_peak_rss // 100):
            self.at_peak = dump
            self.at_peak_rss = total
        growth, self.pending_growth = self.pending_growth, 0
        thread = next((t for t in dump.threads if t.thread_id == dump.attributed_thread), None)
        if growth <= 0 or thread is None or not thread.frames:
            return
        # Attributed to the innermost frame only: counting every frame on the stack would
        # put <module> and main() on top of every table, since they are on every stack.
        leaf = thread.frames[0]
        _bump(self.by_line, (leaf.name, leaf.filename, leaf.line), growth)
        _bump(self.by_function, (leaf.name, leaf.filename), growth)

    def sites(self, limit: int = 20) -> tuple[list[GrowthSite], list[GrowthSite]]:
        lines = sorted(self.by_line.items(), key=lambda kv: -kv[1][0])[:limit]
        funcs = sorted(self.by_function.items(), key=lambda kv: -kv[1][0])[:limit]
        return (
            [GrowthSite(n, f, ln, b, c) for (n, f, ln), (b, c) in lines],
            [GrowthSite(n, f, None, b, c) for (n, f), (b, c) in funcs],
        )


def _bump(table: dict[Any, list[int]], key: Any, growth: int) -> None:
    entry = table.get(key)
    if entry is None:
        if len(table) >= MAX_SITES:  # bounded: forget the smallest site
            del table[min(table, key=lambda k: table[k][0])]
        table[key] = [growth, 1]
    else:
        entry[0] += growth
        entry[1] += 1


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self.clock = clock
        self.tokens = float(self.burst)
        self.stamp = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self) -> float:
        """Take a token; returns 0, or the seconds to wait before one is there (none taken)."""
        self._refill()
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate
