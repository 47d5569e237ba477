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
- :func:`cut_cmdline`, :func:`fuller_cmdline`: a command line shortened by the daemon's
  rule for long ones (an argument cut ends with ``…``; a last argument ``…`` stands for
  those left out), and the pick between a cut copy and the whole one: the flight
  recorder's keyframes carry an exited process's command line cut, its ``attached`` frame
  the whole one, and a reader that has both keeps the whole one.
- :func:`display_name`: the one rule for naming a process to a person (messages, alerts,
  legends, reports, memtop): its label, else the script or module a Python interpreter
  runs (``serve_yolo.py``, ``-m pkg``), else its ``comm``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Final

MAX_LABEL_CHARS: Final = 128
#: What ends an argument that was cut, and stands alone for the arguments left out.
CUT: Final = "…"


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


def cut_cmdline(args: Sequence[str], limit: int, arg_limit: int) -> list[str]:
    """``args`` in at most about ``limit`` characters: each argument at most ``arg_limit``
    (cut ones end with :data:`CUT`), and past ``limit`` one last :data:`CUT` for the rest."""
    out: list[str] = []
    total = 0
    for arg in args:
        if len(arg) > arg_limit:
            arg = arg[: arg_limit - 1] + CUT
        if total + len(arg) > limit:
            out.append(CUT)
            break
        total += len(arg)
        out.append(arg)
    return out


def _cut_of(short: Sequence[str], whole: Sequence[str]) -> bool:
    """Whether ``short`` is ``whole`` cut by :func:`cut_cmdline` (and not ``whole`` itself)."""
    if list(short) == list(whole) or len(short) > len(whole) + 1:
        return False
    for i, arg in enumerate(short):
        if arg == CUT and i == len(short) - 1 and i <= len(whole):
            return True
        if i >= len(whole):
            return False
        if arg != whole[i] and not (arg.endswith(CUT) and whole[i].startswith(arg[:-1])):
            return False
    return True


def fuller_cmdline(new: Sequence[str], known: Sequence[str] | None) -> list[str]:
    """The command line to keep when ``new`` arrives for a process known with ``known``:
    ``known`` when ``new`` is only a cut copy of it (a keyframe's), else ``new`` (the
    process ran another program)."""
    if known and _cut_of(new, known):
        return list(known)
    return list(new)


#: An interpreter's program name: python, python3, python3.11, pypy3, python3.12d...
_PYTHON = re.compile(r"^(python|pypy)(\d+(\.\d+)?)?[dmu]?$")
#: Interpreter options that take the next argument (``-X dev``, ``-W error``).
_WITH_ARG = frozenset({"-X", "-W", "--check-hash-based-pycs"})


def script_of(cmdline: Sequence[str]) -> str | None:
    """What a Python interpreter's command line runs: the script's file name
    (``serve_yolo.py``), ``-m MODULE``, or None (not an interpreter, ``-c CODE``, a REPL)."""
    if not cmdline or not _PYTHON.match(os.path.basename(cmdline[0])):
        return None
    args = iter(cmdline[1:])
    for arg in args:
        if arg == "-m" or (arg.startswith("-m") and len(arg) > 2 and not arg.startswith("--")):
            module = next(args, None) if arg == "-m" else arg[2:]
            return f"-m {module}" if module else None
        if arg.startswith("-c") or arg == "-":
            return None
        if arg in _WITH_ARG:
            next(args, None)
            continue
        if arg.startswith("-"):
            continue
        return os.path.basename(arg) or None
    return None


def display_name(label: str | None, name: str, cmdline: Sequence[str] = ()) -> str:
    """How a process is named to a person: its label, else the script or module its Python
    interpreter runs, else its ``comm`` (issue 28: ``python3 (pid 23612)`` said nothing).
    Raw: the caller escapes it (:func:`printable`) where it is written."""
    return label or script_of(cmdline) or name
