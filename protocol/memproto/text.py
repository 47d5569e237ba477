"""Strings that come from clients or from watched processes, made safe to show.

A label is chosen by a client; a process name (``comm``, set by the process itself with
``prctl(PR_SET_NAME)``) and its command line are the process's own. Either may hold a
newline or a terminal escape: written as they are, they would forge a log line
(``memagent: CRITICAL: ...``) or drive the terminal of whoever reads ``memagent ls``.

- :func:`label_problem`: the rule a label must meet, checked by the daemon (and by the
  CLI before sending): at most :data:`MAX_LABEL_CHARS` characters, all printable (no
  control characters, no line or paragraph separators), not empty.
- :func:`printable`: any string with its non-printable characters escaped (``\\n``,
  ``\\x1b``), for log lines, alert messages and plain-text output.
"""

from __future__ import annotations

from typing import Final

MAX_LABEL_CHARS: Final = 128


def label_problem(label: str) -> str | None:
    """Why ``label`` is not acceptable; None when it is."""
    if not label:
        return "a label cannot be empty"
    if len(label) > MAX_LABEL_CHARS:
        return f"a label has at most {MAX_LABEL_CHARS} characters (this one has {len(label)})"
    if not label.isprintable():
        bad = next(c for c in label if not c.isprintable())
        return f"a label holds printable characters only, not {bad!r}"
    return None


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped; printable text unchanged."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
