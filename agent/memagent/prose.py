"""Sizes and stack frames in words for people, in one place: the commands' text
(:mod:`memagent.cli.render`) and the rooms' own outputs (the gate's summary and verdicts,
a recording's report) say them the same way, and neither imports the other for it."""

from __future__ import annotations

from memproto.text import printable
from memproto.units import format_size


def human_bytes(n: int | None) -> str:
    """A size in prose (``1.25 GiB``): :func:`memproto.units.format_size`, long form."""
    return format_size(n, long=True)


def frame_text(function: str, filename: str, line: int | None) -> str:
    """``function (file:line)``; a watched process chooses its file and function names."""
    return f"{printable(function)} ({printable(filename)}:{line})"
