"""What ``memagent run`` says at the end: the verdict, the summary on stderr, the JSON
report (``--report``), the JUnit file (``--junit``) and the GitHub step summary; and the
report read back (:func:`read_report`, ``memagent admit --report``).

Pure but for the writes: :func:`judge` takes the figures the embedded agent gave over the
wire (:class:`Outcome`), the rest formats them.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from memproto.records import GrowthSite, ProcessInfo, StackDump
from memproto.text import printable

from ..errors import CANNOT_WRITE, CommandFailed
from ..prose import frame_text, human_bytes
from . import OBSERVED, WORST_CASE
from .fits import FitVerdict, bounds_json
from .fits import summary as fits_summary

#: Frames of the stack at the peak kept per process in the report.
STACK_DEPTH = 20
#: Growth sites listed (the summary shows fewer).
TOP_SITES = 10
#: A run report is a few KiB; anything this big is not one.
MAX_REPORT = 16 << 20
#: ``memagent admit``'s ``--json`` code of a report it cannot read.
BAD_REPORT = "bad-report"


@dataclass
class ProcessPeak:
    pid: int
    cmdline: list[str]
    rss_peak_bytes: int
    rss_peak_exact: bool
    vram_peak_bytes: int | None
    stack_at_peak: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, p: ProcessInfo, dump: StackDump | None) -> ProcessPeak:
        return cls(p.pid, list(p.cmdline), p.rss_peak_bytes, p.rss_peak_exact, p.vram_peak_bytes,
                   stack_lines(dump))


def stack_lines(dump: StackDump | None) -> list[str]:
    """The attributed thread's frames (else the first thread's), innermost first."""
    if dump is None or not dump.threads:
        return []
    thread = dump.attributed() or dump.threads[0]
    return [frame_text(f.name, f.filename, f.line) for f in thread.frames[:STACK_DEPTH]]


@dataclass
class RunBudget:
    rss: int | None
    vram: int | None
    per_process: bool


@dataclass
class Outcome:
    """The figures of one run, from the agent; ``status`` is CMD's wait status turned into
    an exit code (``128 + n`` for signal ``n``), or 126/127 when it could not be started."""

    command: list[str]
    status: int
    duration_s: float
    #: Σ of share-adjusted peaks (the agent's headroom Σ), or Σ of RSS peaks if unknown.
    rss_peak_bytes: int
    processes: list[ProcessPeak]
    growth_sites: list[GrowthSite]
    exec_error: str | None = None
    #: ``--kill-over-budget`` killed the tree.
    killed: bool = False
    #: ``--fits``: the daemon's verdict on each resource the run used (worst case; each
    #: verdict's :meth:`~.fits.FitVerdict.observed` the other bound), and ``--basis``: the
    #: bound the exit status follows.
    fits: list[FitVerdict] | None = None
    fits_basis: str = WORST_CASE
    #: The kernel's peak of the tree's biggest process (``wait4``), when it tells something.
    kernel_max_rss: int | None = None
    #: What the agent could not do, one phrase each (the summary's last lines).
    notes: list[str] = field(default_factory=list)

    @property
    def max_process(self) -> ProcessPeak | None:
        return max(self.processes, key=lambda p: p.rss_peak_bytes, default=None)

    @property
    def max_process_rss(self) -> int:
        """The biggest process's peak: the agent's, or the kernel's when higher (a process
        the agent missed, or saw only between samples)."""
        seen = self.max_process.rss_peak_bytes if self.max_process else 0
        return max(seen, self.kernel_max_rss or 0)

    @property
    def missed(self) -> bool:
        """The kernel saw a process peak higher than any the agent reported."""
        return self.max_process_rss > (self.max_process.rss_peak_bytes if self.max_process else 0)

    @property
    def vram_peak_bytes(self) -> int | None:
        known = [p.vram_peak_bytes for p in self.processes if p.vram_peak_bytes is not None]
        return sum(known) if known else None


def excess(outcome: Outcome, budget: RunBudget) -> list[str]:
    """Each budget exceeded, as a phrase (empty: within budget)."""
    out: list[str] = []
    if budget.per_process:
        for p in outcome.processes:
            if budget.rss is not None and p.rss_peak_bytes > budget.rss:
                out.append(f"PID {p.pid} RSS peak {human_bytes(p.rss_peak_bytes)} is "
                           f"{human_bytes(p.rss_peak_bytes - budget.rss)} over {human_bytes(budget.rss)}")
            if budget.vram is not None and (p.vram_peak_bytes or 0) > budget.vram:
                v = p.vram_peak_bytes or 0
                out.append(f"PID {p.pid} VRAM peak {human_bytes(v)} is {human_bytes(v - budget.vram)} over "
                           f"{human_bytes(budget.vram)}")
        if budget.rss is not None and outcome.missed and outcome.max_process_rss > budget.rss:
            out.append(f"a process's RSS peak {human_bytes(outcome.max_process_rss)} (the kernel's, wait4) is "
                       f"{human_bytes(outcome.max_process_rss - budget.rss)} over {human_bytes(budget.rss)}")
        return out
    if budget.rss is not None and outcome.rss_peak_bytes > budget.rss:
        out.append(f"Σ RSS peak {human_bytes(outcome.rss_peak_bytes)} is "
                   f"{human_bytes(outcome.rss_peak_bytes - budget.rss)} over {human_bytes(budget.rss)}")
    vram = outcome.vram_peak_bytes or 0
    if budget.vram is not None and vram > budget.vram:
        out.append(f"Σ VRAM peak {human_bytes(vram)} is {human_bytes(vram - budget.vram)} over "
                   f"{human_bytes(budget.vram)}")
    return out


def decisive_fits(outcome: Outcome) -> list[FitVerdict]:
    """``--fits``'s verdicts on the bound the exit status follows (``--basis``)."""
    return [v.observed() if outcome.fits_basis == OBSERVED else v for v in outcome.fits or []]


def failures(outcome: Outcome, budget: RunBudget) -> list[str]:
    """Each budget exceeded, and each resource where the run would not fit beside what
    the daemon watches (``--fits``), as a phrase (empty: the run passes)."""
    unfit = [v for v in decisive_fits(outcome) if not v.fits]
    return excess(outcome, budget) + [
        f"would not fit here: {v.name} {human_bytes(v.over_bytes)} over" if v.capacity_bytes is not None
        else f"would it fit here? cannot tell for {v.name}" for v in unfit]


def summary_lines(outcome: Outcome, budget: RunBudget, exit_status: int) -> list[str]:
    over = failures(outcome, budget)
    biggest = outcome.max_process
    verdict = " (over budget)" if excess(outcome, budget) else " (would not fit here)" if over else ""
    own = f"; the command itself exited {outcome.status}" if outcome.status != exit_status else ""
    lines = [f"memagent run: {printable(' '.join(outcome.command))}: exit {exit_status}{verdict}"
             + (", killed" if outcome.killed else "") + f" after {outcome.duration_s:.2f} s{own}"]
    lines.append(f"  Σ RSS peak {human_bytes(outcome.rss_peak_bytes)} over {len(outcome.processes)} "
                 f"process{'' if len(outcome.processes) == 1 else 'es'}"
                 + (f" (budget {human_bytes(budget.rss)}{' per process' if budget.per_process else ''})"
                    if budget.rss is not None else ""))
    if biggest is not None:
        lines.append(f"  biggest: PID {biggest.pid} {human_bytes(biggest.rss_peak_bytes)}"
                     + ("" if biggest.rss_peak_exact else " (sampled: the true peak may be higher)")
                     + f" {printable(' '.join(biggest.cmdline))[:80]}")
    if outcome.missed:
        lines.append(f"  the kernel says a process of the tree peaked at {human_bytes(outcome.max_process_rss)} "
                     "(wait4's ru_maxrss), more than the agent saw of any: it missed a short-lived process "
                     "(no kernel process events without root)")
    vram = outcome.vram_peak_bytes
    lines.append(f"  VRAM peak {human_bytes(vram) if vram is not None else 'none'}"
                 + (f" (budget {human_bytes(budget.vram)})" if budget.vram is not None else ""))
    lines.extend(f"  over budget: {phrase}" for phrase in excess(outcome, budget))
    if outcome.fits is not None:
        lines.append("  would it fit beside what the daemon watches?")
        lines.extend(f"    {line}" for line in fits_summary(outcome.fits)
                     + fits_summary([v.observed() for v in outcome.fits]))
        lines.append(f"    (the exit status follows the {outcome.fits_basis} bound)")
    if biggest is not None and biggest.stack_at_peak:
        lines.append(f"  stack at the peak of PID {biggest.pid} (innermost first):")
        lines.extend(f"    {frame}" for frame in biggest.stack_at_peak[:8])
    lines.extend(f"  note: {printable(note)}" for note in outcome.notes)
    if outcome.growth_sites:
        lines.append("  top growth sites:")
        lines.extend(f"    {human_bytes(s.bytes):>9}  {frame_text(s.function, s.filename, s.line)}"
                     for s in outcome.growth_sites[:5])
    return lines


def report_json(outcome: Outcome, budget: RunBudget, exit_status: int) -> dict[str, Any]:
    return {
        "command": outcome.command,
        "exit_status": exit_status,
        #: CMD's own exit status (128 + n: killed by signal n; 126/127: could not be started),
        #: kept when the run's is the over-budget status.
        "command_exit_status": outcome.status,
        "over_budget": bool(excess(outcome, budget)),
        "budget_rss_bytes": budget.rss,
        "budget_vram_bytes": budget.vram,
        "rss_peak_bytes": outcome.rss_peak_bytes,
        "max_process_rss_peak_bytes": outcome.max_process_rss,
        "kernel_max_rss_bytes": outcome.kernel_max_rss,
        "vram_peak_bytes": outcome.vram_peak_bytes,
        "duration_s": round(outcome.duration_s, 3),
        "processes": [{"pid": p.pid, "cmdline": p.cmdline, "rss_peak_bytes": p.rss_peak_bytes,
                       "rss_peak_exact": p.rss_peak_exact, "vram_peak_bytes": p.vram_peak_bytes,
                       "stack_at_peak": p.stack_at_peak} for p in outcome.processes],
        "growth_sites": [{"function": s.function, "filename": s.filename, "line": s.line, "bytes": s.bytes,
                          "samples": s.samples} for s in outcome.growth_sites],
        "fits": None if outcome.fits is None else {
            "fits": all(v.fits for v in decisive_fits(outcome)), "basis": outcome.fits_basis,
            "resources": [v.to_json() for v in outcome.fits], **bounds_json(outcome.fits, outcome.fits)},
    }


#: XML's character data: ``&``, ``<`` and ``>`` as entities (what ``xml.sax.saxutils.escape``
#: does; that module imports ``urllib.request`` and ``http.client``, a third of a run's own
#: start-up cost for this, issue 26).
_XML_TEXT = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
#: An attribute's value: besides, the white space a parser would normalise, as character references.
_XML_ATTR = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "\n": "&#10;", "\r": "&#13;", "\t": "&#9;"})


def xml_text(data: str) -> str:
    """``data`` as XML character data."""
    return data.translate(_XML_TEXT)


def xml_attr(data: str) -> str:
    """``data`` as a quoted XML attribute value, as ``xml.sax.saxutils.quoteattr`` quotes it:
    in double quotes, in single ones when it holds a double quote but no single one, else
    in double quotes with ``&quot;``."""
    data = data.translate(_XML_ATTR)
    if '"' not in data:
        return f'"{data}"'
    if "'" not in data:
        return f"'{data}'"
    return '"{}"'.format(data.replace('"', "&quot;"))


def junit_xml(outcome: Outcome, budget: RunBudget, exit_status: int) -> str:
    over = failures(outcome, budget)
    name = xml_attr(" ".join(outcome.command)[:200])
    body = "\n".join(summary_lines(outcome, budget, exit_status))
    failure = (f'    <failure message={xml_attr("; ".join(over))} type="over_budget">{xml_text(body)}</failure>\n'
               if over else "")
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<testsuite name="memagent run" tests="1" failures="{1 if over else 0}" errors="0" '
            f'time="{outcome.duration_s:.3f}">\n'
            f'  <testcase classname="memagent.run" name={name} time="{outcome.duration_s:.3f}">\n'
            f"{failure}    <system-err>{xml_text(body)}</system-err>\n"
            "  </testcase>\n</testsuite>\n")


def markdown(outcome: Outcome, budget: RunBudget, exit_status: int) -> str:
    over = failures(outcome, budget)
    cmd = printable(" ".join(outcome.command)).replace("`", "'")
    verdict = "❌ over budget" if excess(outcome, budget) else "❌ would not fit here" if over else "✅ within budget"
    rows = [f"### memagent run: {verdict}", "",
            f"`{cmd}` exited {outcome.status} after {outcome.duration_s:.1f} s"
            + (f"; memagent run exited {exit_status}" if exit_status != outcome.status else ""), "",
            "| | peak | budget |", "|---|---|---|",
            f"| Σ RSS | {human_bytes(outcome.rss_peak_bytes)} | {human_bytes(budget.rss) if budget.rss else '-'} |",
            f"| VRAM | {human_bytes(outcome.vram_peak_bytes) if outcome.vram_peak_bytes is not None else '-'} | "
            f"{human_bytes(budget.vram) if budget.vram else '-'} |", ""]
    rows.extend(f"- {phrase}" for phrase in over)
    return "\n".join(rows) + "\n\n"


def write_text(path: str, text: str, append: bool = False) -> None:
    """Write (or append) ``text`` (:func:`open_output`); OSError is the caller's to report."""
    with os.fdopen(open_output(path, append), "w", encoding="utf-8") as f:
        f.write(text)


def open_output(path: str, append: bool = False, probe: bool = False) -> int:
    """A descriptor to write ``path`` (truncated unless ``append``), never through what
    another user planted there: the last component is not followed if it is a symbolic
    link (``O_NOFOLLOW``; refused), only a regular file is written (a FIFO does not block:
    ``O_NONBLOCK``), and in a directory others can write to (``/tmp``) an existing file is
    written only if it is ours and has no other name (a hard link). A new file is created
    exclusively (``O_EXCL``): nothing can be slipped in between the check and the write.
    ``probe``: only find out (OSError if it could not be written), a file created to find
    out removed again; then -1."""
    head, tail = os.path.split(path)
    if tail in ("", ".", ".."):
        raise OSError(errno.EISDIR, "it is a directory")
    directory = os.open(head or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        shared = bool(os.fstat(directory).st_mode & stat.S_IWOTH)
        flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_APPEND if append else 0)
        try:
            fd, created = os.open(tail, flags | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=directory), True
        except FileExistsError:
            fd, created = _open_existing(tail, flags, directory), False
        try:
            if not created:
                _check_existing(fd, shared)
            if probe:
                if created:
                    os.unlink(tail, dir_fd=directory)
                os.close(fd)
                return -1
            if not append and not created:
                os.ftruncate(fd, 0)
        except BaseException:
            os.close(fd)
            raise
        return fd
    finally:
        os.close(directory)


def _open_existing(name: str, flags: int, directory: int) -> int:
    try:
        return os.open(name, flags, dir_fd=directory)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "it is a symbolic link (not followed)") from None
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads
            raise OSError(errno.ENXIO, "not a regular file") from None
        raise


def _check_existing(fd: int, shared: bool) -> None:
    """An existing file is written only if regular, and (in a directory others can write
    to) ours with one name: else another user's planted file, or a hard link to a victim."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EPERM, "not a regular file")
    if shared and st.st_uid != os.geteuid():
        raise OSError(errno.EPERM, f"owned by UID {st.st_uid}, in a directory others can write to")
    if shared and st.st_nlink > 1:
        raise OSError(errno.EPERM, "it has other names (hard links), in a directory others can write to")


def check_writable(path: str) -> None:
    """Refuse, before CMD runs, a ``--report``/``--junit`` path that could not be written at
    the end (:class:`~memagent.errors.CommandFailed`, exit 1); a file created to find out is removed again."""
    try:
        open_output(path, probe=True)
    except OSError as exc:
        raise CommandFailed(CANNOT_WRITE, f"cannot write {printable(path)}: {exc.strerror or exc}") from None


def write_outputs(outcome: Outcome, budget: RunBudget, exit_status: int, report: str | None,
                  junit: str | None) -> list[str]:
    """The files asked for; one line per one that could not be written."""
    problems: list[str] = []
    jobs: list[tuple[str, str, bool]] = []
    if report:
        jobs.append((report, json.dumps(report_json(outcome, budget, exit_status), indent=2) + "\n", False))
    if junit:
        jobs.append((junit, junit_xml(outcome, budget, exit_status), False))
    step = os.environ.get("GITHUB_STEP_SUMMARY")
    if step:
        jobs.append((step, markdown(outcome, budget, exit_status), True))
    for path, text, append in jobs:
        try:
            write_text(path, text, append)
        except OSError as exc:
            problems.append(f"memagent run: cannot write {printable(path)}: {exc.strerror or exc}")
    return problems


def read_report(path: str) -> tuple[int, int | None]:
    """The RSS and VRAM peaks of a ``memagent run --report`` file."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_REPORT + 1)
    except OSError as exc:
        raise CommandFailed(BAD_REPORT, f"cannot read {printable(path)}: {exc.strerror or exc}") from None
    try:
        report: Any = json.loads(data) if len(data) <= MAX_REPORT else None
    except (ValueError, RecursionError):
        report = None
    rss = report.get("rss_peak_bytes") if isinstance(report, dict) else None
    vram = report.get("vram_peak_bytes") if isinstance(report, dict) else None
    if not _size(rss) or not (vram is None or _size(vram)):
        raise CommandFailed(BAD_REPORT, f"{printable(path)}: not a memagent run report (no rss_peak_bytes)")
    return rss, vram


def _size(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62
