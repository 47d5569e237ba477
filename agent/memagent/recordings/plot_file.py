"""The file ``memagent plot -o`` writes: checked before a large recording is read, then
written whole or not at all (a temporary file beside it, renamed), so a reader never sees
half a plot and a failure leaves none. Failures are :class:`PlotFailed`, one line."""

from __future__ import annotations

import os
import tempfile

from ..errors import CANNOT_WRITE, CommandFailed


class PlotFailed(CommandFailed):
    """The plot cannot be made."""


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
