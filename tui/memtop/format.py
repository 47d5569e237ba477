"""Human units and small text helpers for the TUI (binary units, fixed widths)."""

from __future__ import annotations

from rich.text import Text

_UNITS = ("B", "K", "M", "G", "T", "P")
MiB = 1024 * 1024


def size(n: int | None) -> str:
    """Compact size for table cells: ``512K``, ``1.25G``, ``n/a`` for unknown."""
    if n is None:
        return "n/a"
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{int(value)}B"
            if abs(value) < 10:
                return f"{value:.2f}{unit}"
            if abs(value) < 100:
                return f"{value:.1f}{unit}"
            return f"{value:.0f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


def size_long(n: int | None) -> str:
    """Size for prose: ``1.25 GiB``."""
    if n is None:
        return "n/a"
    s = size(n)
    return s if s.endswith("B") or s == "n/a" else f"{s[:-1]} {s[-1]}iB"


def growth(bytes_per_s: float | None) -> str:
    """Growth in MiB/min, signed: ``+12.3M/m``; blank when unknown."""
    if bytes_per_s is None:
        return ""
    per_min = bytes_per_s * 60 / MiB
    if abs(per_min) < 0.05:
        return "0"
    return f"{per_min:+.1f}M/m" if abs(per_min) < 1000 else f"{per_min / 1024:+.1f}G/m"


def percent(fraction: float) -> str:
    return f"{fraction * 100:.0f}%"


def level_style(fraction: float, warn: float, crit: float) -> str:
    """A 16-colour-safe style for a fill level."""
    if fraction >= crit:
        return "bold red"
    if fraction >= warn:
        return "yellow"
    return "green"


def bar(fraction: float, width: int, style: str) -> Text:
    """A horizontal bar of ``width`` cells filled to ``fraction`` (clamped to 0..1)."""
    width = max(0, width)
    filled = round(min(1.0, max(0.0, fraction)) * width)
    text = Text("█" * filled, style=style)
    text.append("░" * (width - filled), style="dim")
    return text
