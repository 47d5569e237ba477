"""The operator's word to the kernel's OOM killer: each label's ``oom_score_adj``
(``[oom_score_adj]``, docs/oom.md), written to the processes that carry the label.

The kernel picks its victim by ``oom_score``: the process's resident memory and swap, plus
``oom_score_adj`` thousandths of the memory it may use (the host's, or its memory cgroup's
limit). A model the operator names ``detector = -800`` is thus spared ahead of a bigger
``trainer = 800``. Nothing is killed here: the kernel decides, with the operator's weights.

When: a live entry is judged (:meth:`OomScores.judge`) after a request attached or
labelled it, and at each tick where the registry's edits moved (an auto-attach, a
relabel, a restore); all of them after a SIGHUP (:meth:`OomScores.apply`). A process whose
label has no entry is never touched; one that had an adjustment and loses its entry, its
label, or is detached gets its original value back (:meth:`OomScores.release`), and so does
every one when the daemon stops cleanly. The original is the value read before the first
write, kept in the saved state so that a daemon that crashed and restarts does not take its
own value for the original (:mod:`memagent.core.restore`).

Who (docs/security.md §15): raising a score is always allowed (any process could do that to
itself). Lowering needs ``CAP_SYS_RESOURCE``, which memagent must lend no local user: a
label's lower value is written only when the label is the operator's (``label_trusted``: set
by root or an admin client, or by an auto pattern judged trusted) **and** the process's
real UID is root's or one of ``oom.trusted_users``. A user's own process, whatever its name
or command line and whatever label a non-admin client gave it, is never lowered.

Identity: every read and write goes through the ``/proc/PID`` directory descriptor the
entry opened at attach (:meth:`memagent.proc.procfs.ProcessHandle.set_oom_score_adj`), so a
PID reused since is never written; a process gone meanwhile is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from memproto.text import printable

from ..errors import AccessDenied, MemagentError
from .watched import Watched

log = logging.getLogger(__name__)

#: The UID whose processes may always be lowered (besides ``oom.trusted_users``).
ROOT_UID = 0
#: Why a lowering was not written (``Watched.oom_refused``): this module's rule, or the kernel.
RULE, KERNEL = "rule", "kernel"


class OomScores:
    """The ``[oom_score_adj]`` table applied to the watched processes."""

    def __init__(self, table: Mapping[str, int] | None = None, trusted_uids: frozenset[int] = frozenset()) -> None:
        """``table``: label -> oom_score_adj (checked by the config); ``trusted_uids``:
        ``oom.trusted_users`` resolved."""
        self.table: dict[str, int] = dict(table or {})
        self.trusted_uids = frozenset({ROOT_UID}) | trusted_uids
        #: The registry's ``edits`` when every live entry was last judged (-1: never).
        self.judged_at = -1

    def apply(self, table: Mapping[str, int], trusted_uids: frozenset[int]) -> None:
        """A reload: the new table and users; every live entry is judged again at the next
        :meth:`sync` (an entry removed from the table gets its original back)."""
        self.table = dict(table)
        self.trusted_uids = frozenset({ROOT_UID}) | trusted_uids
        self.judged_at = -1

    def may_lower(self, w: Watched) -> bool:
        """Whether ``w`` may be given a score below its own: the operator's label on a
        process of root's or of ``oom.trusted_users`` (module doc)."""
        return w.label_trusted and w.uid in self.trusted_uids

    def sync(self, alive: Iterable[Watched], edits: int) -> bool:
        """Judge every live entry when the registry changed since the last time (``edits``:
        its :attr:`~memagent.core.registry.Registry.edits`); nothing to do otherwise.
        Whether an original was kept or given back (what the saved state holds)."""
        if edits == self.judged_at:
            return False
        self.judged_at = edits
        alive = list(alive)
        if not self.table and not any(w.oom_original is not None or w.oom_refused for w in alive):
            return False
        changed = False
        for w in alive:
            changed |= self.judge(w)
        return changed

    def judge(self, w: Watched) -> bool:
        """Write ``w``'s label's entry when it may be written and is not already; give the
        original back when it has none (or may not have it any more). Whether its kept
        original changed."""
        if not w.alive:
            return False
        target = None if w.label is None else self.table.get(w.label)
        if target is None:
            w.oom_refused = None
            return self.release(w)
        if target == w.oom_score_adj and w.oom_original is not None and (target >= w.oom_original
                                                                  or self.may_lower(w)):
            return False
        try:
            own = w.oom_original if w.oom_original is not None else w.handle.oom_score_adj()
        except MemagentError as exc:  # gone meanwhile (the sampler will tell), or unreadable
            log.debug("pid %d: oom_score_adj not read: %s", w.pid, exc)
            return False
        if target < own and not self.may_lower(w):
            if w.oom_refused != RULE:
                w.oom_refused = RULE
                log.warning("pid %d (%s): oom_score_adj %d of label %s not written: lower than its own %d, and %s",
                            w.pid, printable(w.name), target, printable(w.label or ""), own, self._why_not(w))
            return self.release(w)
        return self._write(w, target, own)

    def _why_not(self, w: Watched) -> str:
        if not w.label_trusted:
            return "the label is not the operator's (a non-admin client's, or one its owner steers)"
        return f"its owner (UID {w.uid}) is neither root nor in oom.trusted_users"

    def _write(self, w: Watched, target: int, own: int) -> bool:
        try:
            w.handle.set_oom_score_adj(target)
        except AccessDenied:
            if w.oom_refused != KERNEL:
                w.oom_refused = KERNEL
                log.warning("pid %d (%s): the kernel refused oom_score_adj %d (lowering needs CAP_SYS_RESOURCE)",
                            w.pid, printable(w.name), target)
            return self.release(w)
        except MemagentError as exc:
            log.debug("pid %d: oom_score_adj not written: %s", w.pid, exc)
            return False
        kept = w.oom_original is None
        if kept:
            w.oom_original = own
        w.oom_refused = None
        w.oom_score_adj = target
        w.refresh_row()
        log.info("pid %d (%s) labelled %s: oom_score_adj %d (its own: %d)", w.pid, printable(w.name),
                 printable(w.label or ""), target, own)
        return kept

    def release(self, w: Watched) -> bool:
        """Give ``w`` its original ``oom_score_adj`` back, if this daemon changed it (or a
        daemon before it: the saved original). Whether there was one."""
        original, w.oom_original = w.oom_original, None
        if w.oom_score_adj is None and original is None:
            return False
        w.oom_score_adj = None
        w.refresh_row()
        if original is None or not w.alive:
            return True
        try:
            w.handle.set_oom_score_adj(original)
            log.info("pid %d (%s): oom_score_adj %d again, its own", w.pid, printable(w.name), original)
        except MemagentError as exc:  # gone: nothing to give back
            log.debug("pid %d: oom_score_adj not given back: %s", w.pid, exc)
        return True

    def release_all(self, entries: Iterable[Watched]) -> None:
        """A clean stop: every process this daemon adjusted gets its own value back."""
        for w in entries:
            self.release(w)

    def counts(self, entries: Iterable[Watched]) -> tuple[int, int]:
        """(live processes adjusted, live processes whose lowering was refused)."""
        adjusted = refused = 0
        for w in entries:
            if w.alive:
                adjusted += w.oom_score_adj is not None
                refused += w.oom_refused is not None
        return adjusted, refused
