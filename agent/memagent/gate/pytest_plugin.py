"""memagent's pytest plugin: each test's exact peak RSS, and a memory budget per test.

Loaded in every pytest run of an environment that has memagent (entry point ``pytest11``),
so it imports nothing of the agent until it is asked, and then only the ``proc`` layer and
the size parser: without ``--memagent`` and without a ``memory_budget`` marker it measures,
prints and imports nothing.

* ``pytest --memagent``: a terminal summary section, each test's peak RSS and growth,
  biggest peak first (``--memagent-top N``, 20 by default).
* ``@pytest.mark.memory_budget("200MiB")`` (``memagent run``'s SIZE syntax): the test fails
  when its peak RSS exceeds the budget; ``growth=True`` compares the growth instead. The
  marker is itself the ask: it acts without ``--memagent``.

How a peak is measured (``docs/pytest.md``): before the test's setup, the kernel's
high-water mark of this process (``VmHWM``) is reset to its current RSS (``clear_refs``
``5``); at the end of its call phase ``VmHWM`` is the highest RSS the process had in
between, whatever the moment, however short. The window is setup + call: a fixture's load
peak is the test's; teardown is not in it, because the verdict comes with the call's report
(a teardown failure would read as an error of the fixture). Where the kernel refuses the
reset, the figure is flagged not exact (:meth:`_Meter.end`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from memagent.proc.procfs import ProcessHandle, ProcFS

MARKER = "memory_budget"
DEFAULT_TOP = 20


def _top(text: str) -> int:
    """``--memagent-top N``: a count of tests, at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of tests: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {n}")
    return n


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memagent", "memagent: exact peak RSS per test")
    group.addoption("--memagent", action="store_true", default=False,
                    help="report each test's peak RSS (the kernel's high-water mark, exact) and growth "
                         "in the terminal summary")
    group.addoption("--memagent-top", type=_top, default=DEFAULT_TOP, metavar="N",
                    help=f"with --memagent: how many tests the summary lists, biggest peak first "
                         f"(default {DEFAULT_TOP})")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(size, growth=False): fail the test when its peak RSS (setup + call, the kernel's "
        "high-water mark) exceeds size (512MiB, 2G, 1.5GiB or bytes); growth=True: its growth over "
        "the RSS at the test's start. Acts without --memagent.")
    config.pluginmanager.register(PeakRecorder(config), "memagent-peaks")


@dataclass(frozen=True, slots=True)
class Budget:
    """A test's ``memory_budget``: bytes, and whether they bound the growth or the peak."""

    size: int
    growth: bool


@dataclass(frozen=True, slots=True)
class Window:
    """What the meter read when a test's window opened."""

    rss_start: int
    hwm_start: int
    #: The kernel reset its high-water mark at the start: the peak will be exact.
    reset: bool


@dataclass(frozen=True, slots=True)
class Measured:
    """One test's figures, as the summary lists them."""

    nodeid: str
    peak: int
    #: peak - RSS at the test's start.
    growth: int
    exact: bool


def read_budget(marker: pytest.Mark) -> tuple[Budget | None, str | None]:
    """A ``memory_budget`` marker, checked: (the budget, None), or (None, what is wrong, in
    one line, ``memory_budget: ...``)."""
    from memagent.config import parse_size
    from memagent.errors import ConfigError

    unknown = sorted(set(marker.kwargs) - {"growth"})
    if len(marker.args) != 1 or unknown:
        usage = f'{MARKER}: expected {MARKER}(SIZE) or {MARKER}(SIZE, growth=True), e.g. {MARKER}("200MiB")'
        got = f"unknown: {', '.join(unknown)}" if unknown else f"got {len(marker.args)} arguments"
        return None, f"{usage} ({got})"
    growth = marker.kwargs.get("growth", False)
    if not isinstance(growth, bool):
        return None, f"{MARKER}: growth must be True or False, not {growth!r}"
    try:
        return Budget(parse_size(marker.args[0], MARKER), growth), None
    except ConfigError as exc:
        return None, str(exc)


def under_run(procfs: ProcFS) -> str | None:
    """Why this process's high-water mark must be left alone, or None: ``memagent run``
    judges its exact peak on that mark, which a reset per test would take from it. Known by
    the environment (``MEMAGENT_RUN_PID``) or, where that was stripped (``env -i``, tox), by
    a run among the ancestors (:mod:`memagent.gate.marks`); when that cannot be told, the
    mark is left alone too: a per-test figure flagged not exact is better than a gate that
    passes over its budget."""
    from memagent.gate.marks import UNDER_RUN, gate_ancestor

    if os.environ.get(UNDER_RUN):
        return f"memagent run (PID {os.environ[UNDER_RUN]}) watches this process and judges its peak"
    found = gate_ancestor(procfs, os.getpid())
    if found.gate is not None:
        return f"memagent run (PID {found.gate}, an ancestor) watches this process and judges its peak"
    if found.unsure is not None:
        return f"cannot tell whether memagent run watches this process ({found.unsure})"
    return None


class _Meter:
    """This process's own /proc files, opened once (:class:`~memagent.proc.procfs.ProcessHandle`:
    two ``pread`` per reading)."""

    def __init__(self, handle: ProcessHandle, procfs: ProcFS) -> None:
        self.handle = handle
        #: Why the high-water mark is not reset (the kernel refused; ``memagent run`` watches
        #: this process, or it cannot be told that none does): then no peak is exact. None
        #: while it is reset.
        self.refused: str | None = under_run(procfs)

    def _read(self) -> tuple[int, int]:
        """(VmHWM, VmRSS) now, in bytes."""
        _, memory = self.handle.memory()
        rss = memory.rss_bytes or 0
        return max(memory.hwm_bytes or 0, rss), rss

    def begin(self) -> Window:
        from memagent.errors import MemagentError

        reset = False
        if self.refused is None:
            try:
                self.handle.clear_refs()
                reset = True
            except MemagentError as exc:  # AccessDenied, CannotRead, NoSuchProcess (no clear_refs file)
                self.refused = str(exc)
        hwm, rss = self._read()
        return Window(rss, hwm, reset)

    def end(self, window: Window) -> tuple[int, bool]:
        """(peak, exact). After a reset, VmHWM is the window's peak. Without one it is the
        peak only if it rose during the window (a new high for the whole process); else the
        window's peak lies below an older high and is unknown: the figure is then the
        larger of the RSS read at the window's start and at its end, a lower bound."""
        hwm, rss = self._read()
        if window.reset or hwm > window.hwm_start:
            return hwm, True
        return max(window.rss_start, rss), False


_WINDOW = pytest.StashKey[tuple[Window, Budget | None]]()


class PeakRecorder:
    """The hooks; measures a test only when ``--memagent`` is on or it has a budget."""

    def __init__(self, config: pytest.Config) -> None:
        self.report = bool(config.getoption("memagent"))
        self.top: int = config.getoption("memagent_top")
        self.peaks: list[Measured] = []
        self._meter: _Meter | None = None
        #: Why this process's memory cannot be read at all (then nothing is measured).
        self.unavailable: str | None = None

    def meter(self) -> _Meter | None:
        if self._meter is None and self.unavailable is None:
            from memagent.errors import MemagentError
            from memagent.proc.procfs import ProcFS

            try:
                procfs = ProcFS()
                self._meter = _Meter(procfs.open(os.getpid()), procfs)
            except MemagentError as exc:
                self.unavailable = f"cannot read this process's memory: {exc}"
        return self._meter

    @property
    def refused(self) -> str | None:
        """Why the kernel refused to reset the high-water mark (no peak is exact), or None."""
        return self._meter.refused if self._meter is not None else None

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        """Opens the test's window before any fixture is set up. A bad marker (or no way to
        read this process's memory for a budget) fails the setup, once the other plugins'
        setup hooks have run: they expect their teardown to find what their setup left."""
        marker = item.get_closest_marker(MARKER)
        budget, problem = (None, None) if marker is None else read_budget(marker)
        if budget is not None or self.report:
            meter = self.meter()
            if meter is not None:
                item.stash[_WINDOW] = (meter.begin(), budget)
            elif budget is not None:
                problem = f"{MARKER}: {self.unavailable}"
        result = yield
        if problem is not None:
            pytest.fail(problem, pytrace=False)
        return result

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        opened = item.stash.get(_WINDOW, None)
        if opened is None or self._meter is None:
            return (yield)
        window, budget = opened
        try:
            result = yield
        finally:
            peak, exact = self._meter.end(window)
            measured = Measured(item.nodeid, peak, peak - window.rss_start, exact)
            self.peaks.append(measured)
        if budget is not None:
            verdict = over_budget(measured, budget, window.rss_start, self._meter.refused)
            if verdict is not None:
                pytest.fail(verdict, pytrace=False)
        return result

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.report:
            write_summary(terminalreporter, self)


def over_budget(peak: Measured, budget: Budget, rss_start: int, refused: str | None) -> str | None:
    """The one-line reason a test fails its budget, None within it."""
    from memproto.units import format_size

    value = peak.growth if budget.growth else peak.peak
    if value <= budget.size:
        return None
    what = (f"growth {format_size(value, long=True)} (peak {format_size(peak.peak, long=True)} - "
            f"{format_size(rss_start, long=True)} at the test's start)" if budget.growth
            else f"peak RSS {format_size(value, long=True)}")
    caveat = "" if peak.exact else f" [not exact: a lower bound; the high-water mark was not reset: {refused}]"
    return (f"{MARKER}: {what} exceeds the budget of {format_size(budget.size, long=True)} "
            f"by {format_size(value - budget.size, long=True)}{caveat}")


def write_summary(tr: pytest.TerminalReporter, recorder: PeakRecorder) -> None:
    from memproto.units import format_size

    tr.write_sep("=", "memagent: peak RSS per test")
    if recorder.unavailable is not None:
        tr.write_line(f"nothing measured: {recorder.unavailable}")
        return
    tr.write_line("peak: this process's highest RSS from the test's setup to the end of its call "
                  "(kernel high-water mark, reset before each test); growth: peak - RSS at the test's start")
    peaks = sorted(recorder.peaks, key=lambda p: (p.peak, p.growth), reverse=True)
    tr.write_line(f"{'PEAK':>10} {'GROWTH':>10}  {'EXACT':<5}  TEST")
    for p in peaks[: recorder.top]:
        tr.write_line(f"{format_size(p.peak, long=True):>10} {format_size(p.growth, long=True):>10}  "
                      f"{'yes' if p.exact else 'no':<5}  {p.nodeid}")
    if len(peaks) > recorder.top:
        tr.write_line(f"({len(peaks) - recorder.top} more tests not shown: --memagent-top N)")
    if recorder.refused is not None:
        tr.write_line(f"not exact: the high-water mark was not reset ({recorder.refused}): each such "
                      "figure is the larger of the RSS read at the test's start and end, a lower bound, "
                      "unless the process's high-water mark rose during the test")
