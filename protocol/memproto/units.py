"""Sizes for people: one formatter for every screen and message (CLI tables, alert
messages, memtop cells). Binary units; three significant figures at most.

``format_size(n)`` is compact for table cells (``512K``, ``1.25G``); ``long=True`` is for
prose (``1.25 GiB``); bytes are ``512B`` in both. ``None`` (not available) is ``n/a``, never 0.
"""

from __future__ import annotations

_UNITS = ("B", "K", "M", "G", "T", "P")
NOT_AVAILABLE = "n/a"


def format_size(n: int | None, *, long: bool = False) -> str:
    if n is None:
        return NOT_AVAILABLE
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{int(value)}B"
            if abs(value) < 10:
                digits = f"{value:.2f}"
            elif abs(value) < 100:
                digits = f"{value:.1f}"
            else:
                digits = f"{value:.0f}"
            return f"{digits} {unit}iB" if long else f"{digits}{unit}"
        value /= 1024
    raise AssertionError("unreachable")
