"""A process's peak-preserving RSS history."""

from __future__ import annotations

from dataclasses import dataclass

from ..schema import wire


@wire
@dataclass(frozen=True, slots=True)
class Series:
    """Peak-preserving RSS history of one process: each slot is the maximum RSS sampled in
    ``step`` seconds; the last slot ends at ``end_time``; oldest first."""

    pid: int
    start_time: float
    end_time: float
    rss_bytes: list[int]
