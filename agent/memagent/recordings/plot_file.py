"""The file ``memagent plot -o`` writes (:func:`write_plot`): checked before a large
recording is read, then written whole or not at all (a temporary file beside it, renamed),
so a reader never sees half a plot and a failure leaves none. PNG and SVG are drawn by
matplotlib, the optional ``memagent[plot]`` extra, imported only when asked for
(:mod:`.plot_mpl`); HTML needs nothing (:mod:`.plot_html`). Failures are
:class:`PlotFailed`, one line."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from memproto.units import format_size

from ..errors import CANNOT_WRITE, NO_RECORDING, CommandFailed, RecordingUnavailable

if TYPE_CHECKING:  # the reader is imported when the plot is made
    from .timeline import Timeline

#: ``--json`` error codes of ``memagent plot`` (the client's own: hyphens, docs/cli.md; and
#: NO_RECORDING, shared with history and report).
NO_SAMPLES = "no-samples"
MISSING_EXTRA = "missing-extra"
MISSING_MATPLOTLIB = ("PNG and SVG need matplotlib: pip install 'memagent[plot]' "
                      "(or write .html, which needs nothing)")


class PlotFailed(CommandFailed):
    """The plot cannot be made."""


class MissingExtra(PlotFailed):
    """PNG or SVG asked for, and matplotlib (the ``plot`` extra) cannot be imported."""


def _matplotlib_renderer() -> ModuleType:
    try:
        from . import plot_mpl
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] == "matplotlib":
            raise MissingExtra(MISSING_EXTRA, MISSING_MATPLOTLIB) from None
        raise MissingExtra(MISSING_EXTRA, f"matplotlib cannot be imported ({exc}): pip install 'memagent[plot]' "
                           "(or write .html, which needs nothing)") from None
    return plot_mpl


def nothing_line(pids: Sequence[int], labels: Sequence[str], since: str | None, until: str | None) -> str:
    """The failure of a window with nothing to draw of what was asked for (the flags as given)."""
    who = [f"PID {p}" for p in pids] + [f"label {label!r}" for label in labels]
    window = "".join(f" {flag} {text}" for flag, text in (("--since", since), ("--until", until)) if text is not None)
    what = f"no samples of {' or '.join(who)}" if who else "no samples"
    return f"{what} in the recording{' window' + window if window else ''}; nothing written"


def write_plot(read: Callable[[], Timeline], output: str, fmt: str, size: tuple[int, int],
               nothing: str) -> tuple[dict[str, object], str]:
    """Write the plot of the timeline ``read`` returns to ``output`` in ``fmt`` (png, svg,
    html); what was written (the ``--json`` object, a line). ``nothing``: the failure's
    line when there is nothing to draw."""
    from .plot_data import plot_data, title
    from .timeline import iso

    check_plot_path(output)
    render: Callable[..., bytes] | None = None
    if fmt in ("png", "svg"):
        render = _matplotlib_renderer().render
    try:
        timeline = read()
    except RecordingUnavailable as exc:
        raise PlotFailed(NO_RECORDING, str(exc)) from None
    data = plot_data(timeline)
    if data is None or not data.processes:
        raise PlotFailed(NO_SAMPLES, nothing)
    if render is not None:
        content = render(data, fmt, size)
    else:
        from .plot_html import render as render_html

        content = render_html(data, title(data))
    write_whole(output, content)
    path = os.path.abspath(output)
    done: dict[str, object] = {"file": path, "format": fmt, "processes": len(data.processes),
                               "samples": data.samples, "first": iso(data.first), "last": iso(data.last),
                               "bytes": len(content)}
    n = len(data.processes)
    line = (f"{path}: {fmt}, {n} process{'es' if n != 1 else ''}, {data.samples} samples from {iso(data.first)} "
            f"to {iso(data.last)} ({format_size(len(content), long=True)})")
    return done, line


def check_plot_path(path: str) -> None:
    """Fail now, before reading a large recording, if ``path`` cannot be written."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise PlotFailed(CANNOT_WRITE, f"cannot write {path}: it is a directory")
    if not os.path.isdir(parent):
        raise PlotFailed(CANNOT_WRITE, f"cannot write {path}: no directory {parent}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PlotFailed(CANNOT_WRITE, f"cannot write {path}: permission denied")


def write_whole(path: str, content: bytes) -> None:
    """``content`` at ``path`` at once: a reader never sees half a file, a failure leaves none."""
    parent = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    except OSError as exc:
        raise PlotFailed(CANNOT_WRITE, f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would have made it (mkstemp's is 0600)
        os.replace(tmp, path)
    except OSError as exc:
        os.unlink(tmp)
        raise PlotFailed(CANNOT_WRITE, f"cannot write {path}: {exc.strerror or exc}") from None
