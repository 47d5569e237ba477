"""Per-process RSS history: the agent keeps a :class:`memproto.series.PeakSeries` for
every watched process (10 minutes at 1 s by default)."""

from memproto.series import PeakSeries as PeakHistory

__all__ = ["PeakHistory"]
