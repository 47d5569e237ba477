"""Where an OOM kill's victim stood among the watched processes of its memory domain: did
it have the highest OOM score there, and which model did the scores spare?

The kernel's badness (``oom_badness``) is a process's resident memory and swap (and its page
tables) plus ``oom_score_adj`` thousandths of what the domain may use: a memory cgroup's
limit, or the host's RAM and swap. It is computed here from the figures the daemon has at
the alert: for the victim what the kernel's "Killed process" line said (its RSS and
``oom_score_adj``, :class:`memagent.proc.kmsg.Victim`), else its last sample and the value
the daemon set; for the others their last sample and their ``oom_score_adj`` read now. An
estimate (page tables are left out, the samples are up to a tick old), and said as one;
where a score is not known the answer is nil, never a guess (docs/oom.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.watched import Watched

#: oom_score_adj is in thousandths of the domain's memory.
ADJ_SCALE = 1000


@dataclass(frozen=True)
class Contender:
    """One process of the domain as the kernel weighed it: its memory and its adjustment
    (None: not known)."""

    w: Watched
    bytes: int
    oom_score_adj: int | None

    def score(self, total: int) -> float | None:
        if self.oom_score_adj is None:
            return None
        return self.bytes + self.oom_score_adj * total / ADJ_SCALE


@dataclass(frozen=True)
class Standing:
    #: The victim's score was the highest of the domain's (None: a score not known).
    highest: bool | None
    #: The largest process of the domain by memory alone, when that was not the victim:
    #: the one the kernel would have taken without the scores.
    spared: Contender | None


def standing(victim: Contender, others: list[Contender], total: int) -> Standing:
    """``others``: the domain's other live watched processes; ``total``: what the domain
    may use (bytes: the cgroup's limit, or the host's RAM and swap)."""
    spared = max(others, key=lambda c: c.bytes, default=None)
    if spared is not None and spared.bytes <= victim.bytes:
        spared = None
    mine = victim.score(total)
    theirs = [c.score(total) for c in others]
    if mine is None or any(s is None for s in theirs):
        return Standing(None, spared)
    return Standing(all(mine >= s for s in theirs if s is not None), spared)
