"""Each user's share of the flight recorder (docs/recording.md, docs/security.md §10).

The recorder's bytes are bounded (``[record] max_bytes``): without shares, one user whose
short-lived processes an operator's ``auto`` pattern attaches (each with a long command
line) fills the bound, and everyone's history turns over in minutes. So the bytes each
real UID's processes cause (their ``attached``, ``exited`` and ``detached`` frames, their
rows, stacks, and their ``attached`` frames repeated in each segment's keyframe) are
counted per segment, and summed over the segments still on disk: what that UID holds of
the recording now. A UID holding :data:`SHARE` of ``max_bytes`` or more is *over*: its new
processes are held back (nothing of them written) until they have lived :data:`HOLD`
seconds; one that ends sooner is left out, and a ``thinned`` frame counts it; one that
lives on is recorded from then on (its ``attached`` with its first values, its peak
since its start), at most one per :data:`HOLD` seconds while its user stays over.
Once the user's oldest segments are dropped and it is under its share again, its held
processes are recorded. Root's processes and the daemon's own user's are never held.

Pure bookkeeping: the recorder (:mod:`memagent.store.recorder`) asks and reports.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

from ..core.watched import Watched

#: The most of ``max_bytes`` one non-root user's processes may hold (1/16: the others keep
#: at least 15/16 of the recorder's retention, whatever one user does).
SHARE = 1 / 16
#: Seconds a process of a user over its share must live before it is recorded.
HOLD = 10.0
#: What a row of a sample costs once compressed, about (bench/record_size.py's busy case).
ROW_BYTES = 24

Key = tuple[int, float]


@dataclass(slots=True)
class Held:
    """A process not recorded (yet): since when (monotonic), and whether it already ended."""

    watched: Watched
    since: float
    ended: bool = False


class UserShares:
    """Bytes per UID per segment, the processes held back, the ones left out."""

    def __init__(self) -> None:
        #: Never held: root, and the daemon's own user.
        self.exempt = frozenset({0, os.getuid()})
        self._by_segment: dict[int, Counter[int]] = {}
        #: Bytes per UID in the segments kept (the sum of ``_by_segment``).
        self.total: Counter[int] = Counter()
        #: Recorded processes of non-exempt UIDs (their rows are charged to them).
        self.uid_of: dict[Key, int] = {}
        self.held: dict[Key, Held] = {}
        #: Processes left out since the last ``thinned`` frame, per UID.
        self.left_out: Counter[int] = Counter()
        #: Processes left out since the start (status, tests).
        self.left_out_total = 0
        self._promoted_at: dict[int, float] = {}

    def charge(self, segment: int, uid: int, nbytes: int) -> None:
        if nbytes and uid not in self.exempt:
            self._by_segment.setdefault(segment, Counter())[uid] += nbytes
            self.total[uid] += nbytes

    def charge_rows(self, segment: int, rows: object) -> None:
        """The sample's changed rows of non-exempt processes, :data:`ROW_BYTES` each."""
        uid_of = self.uid_of
        if not uid_of:
            return
        for row in rows:  # type: ignore[attr-defined]
            uid = uid_of.get((row[0], row[1]))
            if uid is not None:
                self.charge(segment, uid, ROW_BYTES)

    def forget(self, segment: int) -> None:
        """A segment removed: what it held no longer counts."""
        counts = self._by_segment.pop(segment, None)
        if counts:
            self.total.subtract(counts)
            self.total += Counter()  # drops the zeros

    def over(self, uid: int, max_bytes: int) -> bool:
        return uid not in self.exempt and self.total[uid] >= max_bytes * SHARE

    def hold(self, w: Watched, now: float) -> None:
        self.held[(w.pid, w.start_time)] = Held(w, now)

    def end(self, key: Key) -> bool:
        """A held process exited or was detached: True if it was held (then nothing of
        it is written), counted as left out once."""
        h = self.held.get(key)
        if h is None:
            return False
        if not h.ended:
            h.ended = True
            self.left_out[h.watched.uid] += 1
            self.left_out_total += 1
        return True

    def release(self, key: Key) -> None:
        self.held.pop(key, None)
        self.uid_of.pop(key, None)

    def ripe(self, now: float, max_bytes: int) -> list[Watched]:
        """Held processes to record now: every living one of a user under its share again;
        of a user over it, one that has lived :data:`HOLD` seconds, at most one per
        :data:`HOLD` seconds per user."""
        out: list[Watched] = []
        for key, h in list(self.held.items()):
            if h.ended:
                continue
            uid = h.watched.uid
            if self.over(uid, max_bytes):
                if now - h.since < HOLD or now - self._promoted_at.get(uid, float("-inf")) < HOLD:
                    continue
                self._promoted_at[uid] = now
            del self.held[key]
            self.uid_of[key] = uid
            out.append(h.watched)
        return out

    def take_left_out(self) -> dict[int, int]:
        out = dict(self.left_out)
        self.left_out.clear()
        return out
