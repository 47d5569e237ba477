"""The sample row: **the** declaration of a sample frame's columns, and what is derived from it."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

from ..schema import wire


@wire
@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One row of a sample frame, by name: **the** declaration of the sample row. The
    column lists and the decoder's per-column type checks below are derived from it.

    Fields without a default are the v1.0 columns, in wire order; fields with a default
    were added later (v1.1: VRAM; v1.5: the peak's exactness) and may be absent from an
    older agent's frames.
    """

    pid: int
    start_time: float
    alive: bool
    rss_bytes: int
    rss_peak_bytes: int
    anon_bytes: int
    swap_bytes: int
    vram_bytes: int | None = None
    vram_peak_bytes: int | None = None
    #: v1.5: ``ProcessInfo.rss_peak_exact`` per tick, so that a client sees a reset-peaks
    #: window turn sampled and exact again, and an exited process's exit record arrive,
    #: without asking ``list``. nil only when absent (an older agent): keep the list's flag.
    rss_peak_exact: bool | None = None
    #: v1.10: ``ProcessInfo.oom_score_adj`` per tick (nil: not set by the daemon, or absent).
    oom_score_adj: int | None = None


_SAMPLE_DECL = dataclasses.fields(ProcessSample)
#: Columns every sample frame carries, in this order in v1.0. Decoders look columns up by
#: name, so a newer agent may append columns.
SAMPLE_FIELDS: tuple[str, ...] = tuple(f.name for f in _SAMPLE_DECL if f.default is dataclasses.MISSING)
#: Columns added later, after those (v1.1: ``vram_bytes``, ``vram_peak_bytes``, int or
#: nil; v1.5: ``rss_peak_exact``, a bool). A frame without them (an older agent) decodes
#: with nil there.
OPTIONAL_SAMPLE_FIELDS: tuple[str, ...] = tuple(f.name for f in _SAMPLE_DECL if f.default is not dataclasses.MISSING)
#: What this version's agent sends.
SAMPLE_COLUMNS: tuple[str, ...] = SAMPLE_FIELDS + OPTIONAL_SAMPLE_FIELDS


def _accepted(tp: object) -> type | tuple[type, ...]:
    """The Python types a decoded msgpack value of field type ``tp`` may have.

    ``bool | None`` is ``bool``: such a column is nil only by its absence (an older agent),
    since the agent always knows a flag; and the decoder refuses a ``bool`` for every kind
    but ``bool`` itself (a ``bool`` is an ``int`` to ``isinstance``), so ``(bool, NoneType)``
    would refuse every value but nil.
    """
    if tp is float:
        return (int, float)  # msgpack keeps 1.0 as a float, but a peer may send 1
    args = typing.get_args(tp)
    if bool in args:  # ``bool | None``
        return bool
    if args:  # ``int | None``
        return tuple(a for a in args if isinstance(a, type))
    assert isinstance(tp, type)
    return tp


#: Per column, the types a value may have; bool is never taken for int.
SAMPLE_CHECKS: dict[str, type | tuple[type, ...]] = {
    name: _accepted(tp) for name, tp in typing.get_type_hints(ProcessSample).items()
}
#: Per column, the exact types (no subclass) of :data:`SAMPLE_CHECKS`'s, as msgpack decodes
#: them: a row whose every value's type is in its column's set passes without ``isinstance``
#: (``Sample.validate``'s fast path; bool is in a set only where it is the column's type).
SAMPLE_EXACT: dict[str, frozenset[type]] = {
    name: frozenset(kind if isinstance(kind, tuple) else (kind,)) for name, kind in SAMPLE_CHECKS.items()
}
