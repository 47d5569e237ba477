"""Small text helpers for the TUI: growth rates, percentages, fill bars. Sizes are
:func:`memproto.units.format_size`, the one formatter of every screen."""

from __future__ import annotations

from rich.text import Text

MiB = 1024 * 1024


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
