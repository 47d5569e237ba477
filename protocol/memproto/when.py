"""Times given by people (``--since 2h``, ``--until 2026-11-30T14:00``, ``@UNIX``): one
parser for every command that reads a recording (``memagent history|report|plot``,
``memtop --replay``), so that the same words mean the same moment in each."""

from __future__ import annotations

import datetime as dt
import math
import re

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw]?)$")
#: The last second of the year 9999 UTC: the latest time ``--since``/``--until`` may name.
LATEST = 253_402_300_799.0


def parse_when(text: str, now: float) -> float:
    """Unix seconds of ``text``: a duration back from ``now`` (``90``, ``30s``, ``15m``, ``2h``,
    ``7d``, ``1w``), an ISO 8601 date and time (``2026-11-30T14:00``, local time unless it
    names its zone; ``2026-11-30`` is its midnight), or Unix seconds (``@1764511200``).
    ``ValueError`` with a message for people otherwise."""
    t = text.strip()
    if t.startswith("@"):
        try:
            value = float(t[1:])
        except ValueError:
            raise ValueError(f"not a time: {text!r}") from None
        if not math.isfinite(value):
            raise ValueError(f"not a time: {text!r}")
        return value
    m = _AGO.match(t)
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2) or "s"]
    try:
        when = dt.datetime.fromisoformat(t)
    except ValueError:
        raise ValueError(f"not a time: {text!r} (expected e.g. 2h, 30m, 2026-11-30T14:00 or @UNIX)") from None
    return when.timestamp()  # naive: local time, as the user's clock shows it


def window(since: str | None, until: str | None, now: float) -> tuple[float | None, float | None]:
    """``--since`` and ``--until`` as Unix seconds (None: not given). ``ValueError`` naming
    the flag (``--since: not a time: 'x'``) when one does not parse, names a moment before
    1970 or after the year 9999, or when ``--until`` is before ``--since``."""
    out: list[float | None] = []
    for flag, text in (("since", since), ("until", until)):
        try:
            t = None if text is None else parse_when(text, now)
        except ValueError as exc:
            raise ValueError(f"--{flag}: {exc}") from None
        if t is not None and not 0 <= t <= LATEST:  # else a time shown of it fails, far past any recording
            raise ValueError(f"--{flag}: {text!r} is before 1970 or after the year 9999")
        out.append(t)
    start, end = out
    if start is not None and end is not None and end < start:
        raise ValueError("--until is before --since")
    return start, end
