"""Auto-attach: watch every process, existing or new, whose executable name or command
line matches a pattern, and the children of processes attached with ``--children``.

A scan lists ``/proc`` (~120 µs for 1000 processes) and looks only at PIDs it has not
seen before. A process caught between ``fork`` and ``exec`` still carries its parent's
name, so an unmatched new PID is looked at again on the next few scans.

Matched names: the kernel's ``comm`` and the basename of ``/proc/PID/exe`` (fnmatch,
case-sensitive). Command lines (``auto_cmdline``): argv joined by spaces, its first
:data:`~memagent.config.auto.MAX_CMDLINE` characters, read only for PIDs new to the scan
and only when such patterns are set; matching them takes at most :data:`CMDLINE_BUDGET_S`
of a scan (the PIDs left wait for the next one). The agent's own process and the
memagent/memtop tools are never auto-attached.

Labels come from the ``auto_label`` template (:class:`~memagent.config.auto.Template`):
``{container}`` is the container's name, or its ID's first 12 digits while the name is
not known yet; the name is read off the tick (:mod:`memagent.core.containers`), and when
it arrives the process is labelled again (:meth:`Scanner.relabel`, once, unless a client
has labelled it since) before it is announced again. A rendered label that breaks the
label rule gives the process's ``comm`` instead, logged once per template.

Trust (docs/security.md §8): a label the scanner gives counts in the operator's budgets
(and their alerts, hooks and ``memagent_label_rss_peak_bytes``)
only when the process's real UID is root's, the daemon's own or one of
``auto_trusted_users``, or when the label is made of :data:`~memagent.config.auto.ROOT_FACTS`
alone (``{container}``, ``{unit}``) and the process's cgroup is outside every user's
systemd manager. Everything else a user can choose: its command line (which the match and
the regex groups read), ``comm``, ``exe``, its PID, a rootless container's name. An
untrusted label is still shown (``ls``, memtop, metrics). A child adopted from a followed
parent has its parent's trust; a reload that changes ``auto_trusted_users`` judges each
label the scanner gave again (:meth:`Scanner.retrust`).

Processes that start in a cgroup, unit or container named by ``attach --cgroup/--unit/
--container`` are attached by the rules of :mod:`memagent.core.groups`, here too.

Where the kernel's process events are heard (:mod:`memagent.core.process_events`), a
followed process's child is attached at its fork (:meth:`Scanner.adopt`) and a match at
its exec (:meth:`Scanner.on_exec`); the scan still runs, for what they missed.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from memproto.text import label_problem, printable

from ..config.auto import DEFAULT_WRAPPERS, MAX_CMDLINE, ROOT_FACTS, check_total, compile_cmdline, parse_template
from ..errors import ConfigError, MemagentError
from ..proc.cgroup_identity import delegated_to
from ..proc.procfs import ProcFS
from .groups import Groups
from .registry import MayWatch, Registry, anyone
from .watched import Watched

log = logging.getLogger(__name__)

#: Scans during which an unmatched new PID is looked at again (fork-then-exec).
RECHECK_SCANS = 3
OWN_TOOLS = frozenset({"memagent", "memtop"})
#: Seconds of one scan spent matching command lines, at most: checked before each PID,
#: whose patterns together cost at most ~25 ms (config.auto.MAX_PROGRAM_TOTAL, RE2's
#: linear time); real patterns take microseconds. The PIDs left wait for the next scan.
CMDLINE_BUDGET_S = 0.02


@dataclass(frozen=True)
class Found:
    """A match: the regex groups (by number and name; empty for a name or glob), and the
    executable's basename (None: not readable)."""

    groups: dict[str, str]
    exe: str | None
    #: Matched by a command-line pattern (a wrapper's command line holds its child's).
    by_cmdline: bool = False


@dataclass(frozen=True)
class Given:
    """A label the scanner gave, and what its trust is judged from again on a reload."""

    label: str | None
    #: The real UID of the process it was judged by (for an adopted child: its parent's).
    uid: int
    #: The label is made of root's facts alone (ROOT_FACTS, outside a user's manager).
    rooted: bool


class Scanner:
    def __init__(
        self,
        registry: Registry,
        patterns: Sequence[str] = (),
        *,
        may_watch: MayWatch = anyone,
        label: str | None = None,
        groups: Groups | None = None,
        cmdline: Sequence[str] = (),
        trusted_uids: frozenset[int] = frozenset(),
        given: dict[tuple[int, int], Given] | None = None,
        wrappers: Sequence[str] = DEFAULT_WRAPPERS,
    ) -> None:
        """``label``: the ``auto_label`` template; ``cmdline``: ``auto_cmdline`` patterns
        (both checked by :mod:`memagent.config.auto`: ConfigError if they do not pass);
        ``trusted_uids``: ``auto_trusted_users`` resolved; ``given``: the labels a scanner
        this one replaces gave (judged again with ``trusted_uids``); ``wrappers``:
        ``auto_wrappers`` (:meth:`_held`)."""
        self.registry = registry
        self.groups = groups or Groups(registry)
        self.procfs: ProcFS = registry.procfs
        self.patterns = list(patterns)
        self.may_watch = may_watch
        self.label = label
        try:
            self.cmdline = [compile_cmdline(p) for p in cmdline]
            check_total(self.cmdline)
        except ValueError as exc:
            raise ConfigError("auto_cmdline", str(exc)) from None
        try:
            self.template = None if label is None else parse_template(label)
        except ValueError as exc:
            raise ConfigError("auto_label", str(exc)) from None
        #: Entries labelled while their container's name was not known: (label given, values).
        self._pending: dict[tuple[int, int], tuple[str | None, dict[str, str | None]]] = {}
        self._warned: set[str] = set()
        self._seen: set[int] = set()
        self._recheck: dict[int, int] = {}
        #: PIDs not looked at yet, left by a scan over its budget: before the rechecks next.
        self._deferred: set[int] = set()
        self._own_pid = os.getpid()
        self.wrappers = frozenset(wrappers)
        self._spent = 0.0
        #: Wrappers matched by a command line, waiting to see whether a child of theirs
        #: matches too: scans left before they are attached as themselves.
        self._wrapped: dict[int, int] = {}
        self.trusted_uids = frozenset({0, os.getuid()}) | trusted_uids
        #: The labels this scanner (or the one it replaced) gave, by entry: to judge again.
        self.given: dict[tuple[int, int], Given] = dict(given or {})
        if given:
            self.retrust(self.trusted_uids)

    @property
    def active(self) -> bool:
        """Whether any pattern is set."""
        return bool(self.patterns or self.cmdline)

    def matches(self, pid: int, comm: str) -> bool:
        return self.match(pid, comm) is not None

    def match(self, pid: int, comm: str) -> Found | None:
        """What the first pattern that matches ``pid`` says (names first, then command
        lines, in their order); None if none does."""
        if comm in OWN_TOOLS or pid == self._own_pid:
            return None
        exe = self.procfs.exe_name(pid)  # None: not ours to read, or a kernel thread
        names = [comm] if exe is None else [comm, exe]
        if any(fnmatch.fnmatchcase(n, p) for n in names for p in self.patterns):
            return Found({}, exe)
        if self.cmdline:
            line = self.procfs.cmdline_text(pid, MAX_CMDLINE)
            for pattern in self.cmdline if line else ():
                found = pattern.search(line or "")
                if found is not None:
                    return Found(found, exe, by_cmdline=True)
        return None

    def attach(self, pid: int, comm: str, found: Found) -> Watched:
        """Attach a matched process under its rendered label."""
        label, values, rooted = self._label(pid, comm, found)
        w = self.registry.attach(pid, label=label, may_watch=self.may_watch)[0]
        self._judge(w, Given(label, w.uid, rooted))
        if values is not None:
            self._pending[w.key] = (label, values)
            if w.container is not None and w.container.name is not None and self.relabel(w):
                self.registry.events.attached(w)  # the name was read in between: announced again
        return w

    def _label(self, pid: int, comm: str, found: Found) -> tuple[str | None, dict[str, str | None] | None, bool]:
        """The label, the values it was made of when its ``{container}`` waits for a name
        (to render it again then), and whether it is made of root's facts alone."""
        if self.template is None:  # a regex's first group that took part, else none
            first = next((v for k, v in sorted(found.groups.items()) if k.isdigit() and k != "0" and v), None)
            return (first if first is not None and label_problem(first) is None else None), None, False
        values: dict[str, str | None] = {"comm": comm, "exe": found.exe, "pid": str(pid), "container": None,
                                         "unit": None, **found.groups}
        waits = False
        facts: frozenset[str] = frozenset()
        if self.template.names & {"container", "unit"}:
            try:
                path, identity, name = self.groups.where(pid)
            except MemagentError:
                path, identity, name = None, None, None
            if identity is not None:
                facts = ROOT_FACTS if path and delegated_to(path) is None and identity.user is None else facts
                cid = identity.container_id
                values["unit"] = identity.unit
                values["container"] = name or (cid[:12] if cid else None)
                waits = cid is not None and name is None and "container" in self.template.names
        text = self._render(values, comm)
        rooted = text == self.template.render(values, comm) and self.template.made_of(values, facts)
        return text, (values if waits else None), rooted

    def _render(self, values: dict[str, str | None], comm: str) -> str | None:
        assert self.template is not None
        text = self.template.render(values, comm)
        problem = label_problem(text)
        if problem is None:
            return text
        if self.template.text not in self._warned:
            self._warned.add(self.template.text)
            log.warning("auto_label %r gave %r for %s: %s; labelled by its name instead (logged once)",
                        printable(self.template.text), printable(text[:200]), printable(comm), problem)
        return comm if label_problem(comm) is None else None

    def relabel(self, w: Watched) -> bool:
        """``w``'s container name became known: render its label again with it, if the
        scanner gave its label and no client changed it since. Whether it changed."""
        pending = self._pending.pop(w.key, None)
        if pending is None or w.container is None or w.container.name is None or self.template is None:
            return False
        given, values = pending
        if w.label != given:
            return False  # labelled by a client meanwhile: theirs stays
        label = self._render({**values, "container": w.container.name}, w.name)
        if label == w.label:
            return False
        log.info("%d (%s) labelled %s: its container's name is known now", w.pid, printable(w.name),
                 printable(label or w.name))
        w.label = label
        self.registry.edits += 1
        record = self.given.get(w.key)
        if record is not None:  # the name is root's fact as the ID was, unless it fell back to the comm
            rooted = record.rooted and label == self.template.render({**values, "container": w.container.name}, w.name)
            self._judge(w, Given(label, record.uid, rooted))
        return True

    def _judge(self, w: Watched, given: Given) -> None:
        """Set ``w``'s trust from ``given``, and keep ``given`` to judge it again."""
        self.given[w.key] = given
        w.label_trusted = given.uid in self.trusted_uids or given.rooted

    def retrust(self, trusted_uids: frozenset[int]) -> None:
        """``auto_trusted_users`` changed (SIGHUP): judge each label the scanner gave again,
        where no client has changed it since; forget the entries that are gone."""
        self.trusted_uids = frozenset({0, os.getuid()}) | trusted_uids
        for key, given in list(self.given.items()):
            w = self.registry.entries.get(key)
            if w is None:
                del self.given[key]
            elif w.label == given.label:
                trusted = given.uid in self.trusted_uids or given.rooted
                if trusted != w.label_trusted:
                    w.label_trusted = trusted
                    self.registry.edits += 1  # saved, and its oom_score_adj judged again (core/oom.py)

    def adopt(self, pid: int, parent: Watched, *, descendants: bool = True) -> list[Watched]:
        """Attach ``pid``, a child of ``parent`` (whose children are followed): with its
        label, trusted or not, and the rights of the client that asked to follow them; and,
        with ``descendants``, the children it has already. MemagentError if it cannot be."""
        may_watch = parent.follow_may_watch or self.may_watch
        watched = self.registry.attach(pid, label=parent.label, children=descendants, may_watch=may_watch)
        given = self.given.get(parent.key)
        for w in watched:
            w.label_trusted = parent.label_trusted
            if given is not None and w.label == given.label:
                self.given[w.key] = given  # judged with its parent on a reload
            if not w.follow_children:
                w.follow_children = True
                w.follow_may_watch = may_watch
        return watched

    def is_wrapper(self, comm: str, found: Found) -> bool:
        """Whether a match is a wrapper's, through its command line: judged at a scan."""
        return found.by_cmdline and (comm in self.wrappers or found.exe in self.wrappers)

    def _claims(self, child: int) -> bool:
        """Whether a wrapper's child is what its command line named: watched, or matching."""
        if self.registry.find_alive(child) is not None:
            return True
        try:
            return self.match(child, self.procfs.stat(child).comm) is not None
        except MemagentError:  # gone already, or not ours
            return False

    def on_exec(self, pid: int) -> Watched | None:
        """A process not watched ran a new program: attach it now if it matches (a
        wrapper's match is the scan's to judge, once its child is there)."""
        try:
            comm = self.procfs.stat(pid).comm
            found = self.match(pid, comm)
            if found is not None and self.is_wrapper(comm, found):
                self._recheck[pid] = RECHECK_SCANS + 1
                return None
            return None if found is None else self.attach(pid, comm, found)
        except MemagentError as exc:  # gone already, or not ours
            log.debug("auto-attach of %d at exec skipped: %s", pid, exc)
            return None

    def scan(self) -> int:
        """Look at new PIDs; returns how many were attached."""
        followers = {w.pid: w for w in self.registry.alive if w.follow_children}
        if not self.active and not followers and not self.groups.rules:
            return 0
        current = set(self.procfs.pids())
        new = (current - self._seen) | (self._recheck.keys() & current)
        self._seen = current
        self._spent = 0.0  # seconds of command-line matching in this scan (reads and matches)
        for k in [k for k in self._pending if k not in self.registry.entries]:
            del self._pending[k]
        for k in [k for k in self.given if k not in self.registry.entries]:
            del self.given[k]
        # PIDs never looked at first (new, or left by the budget), then the rechecks: a
        # crowd of unmatched PIDs looked at again cannot hold back a new one for long.
        attached = sum(self._look(pid, followers)
                       for pid in sorted(new, key=lambda p: (p in self._recheck and p not in self._deferred, p)))
        # Forget rechecks of PIDs that are gone.
        for pid in [p for p in self._recheck if p not in current]:
            del self._recheck[pid]
        for pid in [p for p in self._wrapped if p not in current]:
            del self._wrapped[pid]
        self._deferred &= self._recheck.keys()
        return attached

    def _look(self, pid: int, followers: dict[int, Watched]) -> int:
        """One PID of a scan: adopted, attached by a rule or a pattern, or looked at again
        later; 1 when attached."""
        if self.registry.find_alive(pid) is not None:
            self._recheck.pop(pid, None)
            return 0
        try:
            stat = self.procfs.stat(pid)
        except MemagentError:
            self._recheck.pop(pid, None)
            return 0
        parent = followers.get(stat.ppid)
        if parent is None and self.cmdline and self._spent > CMDLINE_BUDGET_S:
            self._recheck.setdefault(pid, RECHECK_SCANS + 1)  # matched at the next scan
            self._deferred.add(pid)
            return 0
        self._deferred.discard(pid)
        started = time.perf_counter()
        auto = None if parent is not None or not self.active else self.match(pid, stat.comm)
        self._spent += time.perf_counter() - started
        rule = self.groups.rule_for(pid) if parent is None and auto is None and pid != self._own_pid else None
        if parent is None and auto is None and rule is None:
            left = self._recheck.get(pid, RECHECK_SCANS + 1) - 1
            if left > 0:
                self._recheck[pid] = left
            else:
                self._recheck.pop(pid, None)
            return 0
        if auto is not None and self.is_wrapper(stat.comm, auto) and self._held(pid):
            return 0
        self._recheck.pop(pid, None)
        self._wrapped.pop(pid, None)
        try:
            if parent is not None:
                self.adopt(pid, parent)
            elif rule is not None:
                for w in self.registry.attach(pid, label=rule.label, may_watch=rule.may_watch):
                    w.label_trusted = rule.trusted
            elif auto is not None:
                self.attach(pid, stat.comm, auto)
            return 1
        except MemagentError as exc:
            log.debug("auto-attach of %d skipped: %s", pid, exc)
            return 0

    def _held(self, pid: int) -> bool:
        """A wrapper matched by its command line (``runuser ... sh -c "exec python3
        serve.py"``): whether it is held back this scan rather than attached. Once a child of
        its own is what it named (:meth:`_claims`), it is passed over for good, so that the
        wrapper is no row, series or label sum of its own; until then it waits (it may not
        have forked yet), looked at again at each scan, up to :data:`RECHECK_SCANS`; one
        whose children never match is attached as itself at its last."""
        left = self._wrapped.get(pid, RECHECK_SCANS + 1)
        if left and not any(self._claims(child) for child in self.procfs.children(pid)):
            left -= 1
            if not left:
                self._wrapped.pop(pid, None)
                return False
        else:
            left = 0
        self._wrapped[pid] = left
        if left:
            self._recheck[pid] = left
        else:
            self._recheck.pop(pid, None)
        return True
