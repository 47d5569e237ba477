"""Is a process leaking? Sustained growth, judged on as much history as the urgency allows.

A process's RSS history (one value per ``step``, the slot's maximum) is looked at from its
**latest lowest value** to now: the stretch over which it has grown without ever falling
back (:func:`growth`). A sawtooth that drops back to where it was restarts that stretch
at each drop; a steady process has no trend in it; a leak that frees now and then but
climbs overall keeps its first trough, so the stretch covers all of it.

On that stretch: the least-squares rate, and how well a straight line fits (R²). It is a
leak (:func:`judge`) when the rate is at least ``leak_min_rate``, the headroom left is gone
within ``leak_horizon`` at that rate (*eta*), the fit is good (R² >= :data:`FIT`: the rise
is more than ~10 times the scatter around the line) and the growth has lasted long
enough: :data:`PATIENCE` of *eta* (wait 1% of the time left, keep 99% to act), at least
:data:`MIN_SECONDS` (a burst of allocation is not a leak), at most ``leak_window``.
So 20 MiB/s with 24 GiB left (*eta* 20 min) is judged after 20 s; 1 MiB/s (*eta* 6.8 h)
after 4 min; slow leaks after ``leak_window``.

Pure: values in, verdict out.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import mul

#: Shortest growth ever called a leak (seconds), unless ``leak_window`` is shorter.
MIN_SECONDS = 20.0
#: The growth must have lasted this fraction of the time until the headroom is gone.
PATIENCE = 0.01
#: Least R² of the straight-line fit over the stretch.
FIT = 0.9
_KIB = 1024


@dataclass(frozen=True, slots=True)
class Growth:
    """The growth since the latest lowest value."""

    #: Least-squares slope, bytes per second.
    rate: float
    #: From the lowest value to the last: the time the fit covers.
    seconds: float
    #: R² of the straight-line fit (0.0 when nothing moves or it falls).
    fit: float


@dataclass(frozen=True, slots=True)
class Verdict:
    leaking: bool
    #: Bytes per minute (the alert's value when leaking).
    per_minute: float
    #: Seconds until the headroom is gone at this rate; None when not growing.
    eta: float | None
    #: Seconds of growth it needs to be called a leak at this rate.
    needed: float


def growth(values: list[int], step: float) -> Growth | None:
    """``values`` (bytes, one per ``step`` seconds, oldest first, whole KiB as a history
    keeps them) from the last occurrence of their minimum on; None with fewer than 3 values
    there (it just fell back, or too little history)."""
    if len(values) < 3:
        return None
    low = min(values)
    start = len(values) - 1 - values[::-1].index(low)
    n = len(values) - start
    if n < 3:
        return None
    # Exact integer sums over (slot index, KiB above the low): no rounding, however big.
    ys = [(v - low) // _KIB for v in values[start:]]
    sx, sxx = n * (n - 1) // 2, (n - 1) * n * (2 * n - 1) // 6
    sy, sxy, syy = sum(ys), sum(map(mul, range(n), ys)), sum(map(mul, ys, ys))
    cxx, cxy, cyy = n * sxx - sx * sx, n * sxy - sx * sy, n * syy - sy * sy
    rate = cxy / cxx * _KIB / step
    fit = cxy * cxy / (cxx * cyy) if cyy and cxy > 0 else 0.0
    return Growth(rate, (n - 1) * step, fit)


def judge(g: Growth | None, left: int, min_per_minute: float, horizon: float, longest: float) -> Verdict:
    """Whether growth ``g`` is a leak with ``left`` bytes of headroom; ``longest``: the
    most seconds of growth it may have to wait for (``leak_window`` or the history kept)."""
    if g is None or g.rate <= 0:
        return Verdict(False, 0.0, None, min(longest, MIN_SECONDS))
    eta = left / g.rate
    needed = min(longest, max(MIN_SECONDS, eta * PATIENCE))
    leaking = (g.rate * 60 >= min_per_minute and eta <= horizon and g.fit >= FIT
               and g.seconds >= needed)
    return Verdict(leaking, g.rate * 60, eta, needed)
