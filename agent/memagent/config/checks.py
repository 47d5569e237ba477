"""The kinds of check a configuration key has: numbers and sizes in a range, names,
groups, users, a hook command, a choice among words.

A check is ``check(value, key) -> value``: it returns the value as the daemon holds it,
or raises :class:`ConfigError` naming ``key``, so nothing that passes can crash the
daemon later (no NaN or infinity, no size or period it cannot hold). The file and the
daemon's flags go through the same checks (:mod:`memagent.config.schema`). A check's
:func:`describe` is the "Type" column of the table in ``docs/configuration.md``: a
class says its range, a function says it in the first line of its docstring.
Sizes: :func:`parse_size` (without a unit, 0 or at least 1 MiB).
"""

from __future__ import annotations

import grp
import math
import os
import pwd
import re
import shutil
import stat
from collections.abc import Callable
from typing import Any

from memproto.text import label_problem

from ..errors import ConfigError

#: Of ``[clients] max``, these are only for root and admin-group clients: a crowd of one
#: user's connections never locks an operator out.
RESERVED_FOR_ADMINS = 8
KiB = 1024
MiB = 1024 * 1024
#: No size may exceed this (1 PiB): beyond it, a number is a typo, not a machine.
MAX_SIZE = 1024**5
#: A size written without a unit must be 0 or at least this: ``12`` is not 12 bytes.
MIN_BARE_SIZE = MiB
#: Per-process history slots, at most (4 bytes each, allocated when a process is attached).
MAX_HISTORY_SLOTS = 86_400
#: Where the hook's program is looked for when it has no ``/`` (the hook's own ``PATH``).
HOOK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The largest GID the kernel takes ((gid_t) -1 means "no change").
MAX_GID = 2**32 - 2

_UNITS = {
    "": 1, "b": 1,
    "k": KiB, "kib": KiB, "m": MiB, "mib": MiB, "g": 1024 * MiB, "gib": 1024 * MiB,
    "t": 1024**4, "tib": 1024**4,
    "ki": KiB, "mi": MiB, "gi": 1024 * MiB, "ti": 1024**4,  # Kubernetes' spelling (2Gi)
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
}
_SIZE = re.compile(r"^\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([a-zA-Z]*)\s*$")  # 30 digits: far past 1 PiB


def _size_parts(value: object, key: str) -> tuple[int, bool]:
    """(bytes, whether a unit was written)."""
    if isinstance(value, bool):
        raise ConfigError(key, "expected a size such as 512MiB, 2G or a number of bytes")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(key, "a size cannot be negative")
        return value, False
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m and m.group(2).lower() in _UNITS:
            # Exact: a float of a long number would be inf, and int(inf) raises. Imported
            # here: with decimal, a tenth of `memagent run`'s own start-up (issue 26).
            from fractions import Fraction

            return int(Fraction(m.group(1)) * _UNITS[m.group(2).lower()]), bool(m.group(2))
    raise ConfigError(key, f"not a size: {shown(value)} (use e.g. 512MiB, 2G, 1.5GiB or bytes)")


def parse_size(value: object, key: str = "size") -> int:
    """Bytes from ``512MiB``, ``2G``, ``1.5GiB``, ``2Gi``, ``1000000`` or an integer."""
    return _size_parts(value, key)[0]


def shown(value: object) -> str:
    """``repr(value)``, cut short: an error stays one readable line."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}…({len(text)} characters)"


def _bound(x: float) -> str:
    """A number as a message shows it: ``0.01``, ``1e+09``; an integer too long for a float too."""
    if isinstance(x, int) and abs(x) >= 10**15:
        digits = str(abs(x))
        return f"{'-' if x < 0 else ''}{digits[0]}.{digits[1:4]}e+{len(digits) - 1}"
    return f"{x:g}"


def human(n: int) -> str:
    """A size as a message shows it: ``1MiB``, ``12B``, ``1.099e+42 bytes``."""
    if n >= 10**18:
        return f"{_bound(n)} bytes"
    for unit, size in (("PiB", 1024**5), ("TiB", 1024**4), ("GiB", 1024**3), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


def _spaced(n: int) -> str:
    """A bound as the docs write it: ``0``, ``64 KiB``, ``1 PiB``."""
    return "0" if n == 0 else re.sub(r"(\d)((?:[KMGTP]i)?B)$", r"\1 \2", human(n))


#: ``check(value, key) -> value``; ConfigError naming ``key`` when the value is refused.
Check = Callable[[object, str], Any]


def describe(check: Check) -> str:
    """What a check takes, in a few words (the doc table's "Type" column)."""
    said = getattr(check, "describe", None)
    if callable(said):
        return str(said())
    doc = (check.__doc__ or "").strip().splitlines()
    return doc[0].rstrip(".") if doc else "?"


class Number:
    """A finite number from ``lo`` to ``hi`` (above ``lo`` when ``above``), in ``unit``."""

    def __init__(self, lo: float, hi: float, unit: str = "", *, above: bool = False) -> None:
        self.lo, self.hi, self.unit, self.above = lo, hi, unit, above

    @property
    def range(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        low = f"above {_bound(self.lo)}" if self.above else f"from {_bound(self.lo)}"
        return f"{low} to {_bound(self.hi)}{unit}"

    def describe(self) -> str:
        low = f"> {_bound(self.lo)} and ≤" if self.above else f"{_bound(self.lo)} –"
        return f"number, {low} {_bound(self.hi)}"

    def __call__(self, v: object, key: str) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ConfigError(key, f"expected a number, got {shown(v)}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(key, f"not a finite number: {shown(v)}")
        # Compared before float(): an integer past 1e308 has no float.
        if (v <= self.lo if self.above else v < self.lo) or v > self.hi:
            raise ConfigError(key, f"out of range: {_bound(v)} ({self.range})")
        return float(v)


class Whole:
    """A whole number from ``lo`` to ``hi`` (``2.0`` is taken as 2)."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi

    def describe(self) -> str:
        return f"whole number, {self.lo} – {self.hi}"

    def __call__(self, v: object, key: str) -> int:
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(key, f"not a finite number: {shown(v)}")
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(key, f"expected a whole number, got {shown(v)}")
        if not self.lo <= v <= self.hi:
            raise ConfigError(key, f"out of range: {_bound(v)} (from {self.lo} to {self.hi})")
        return v


class Size:
    """A size from ``lo`` to ``hi`` bytes; without a unit, 0 or at least 1 MiB."""

    def __init__(self, lo: int = 0, hi: int = MAX_SIZE) -> None:
        self.lo, self.hi = lo, hi

    def describe(self) -> str:
        return f"size, {_spaced(self.lo)} – {_spaced(self.hi)}"

    def __call__(self, v: object, key: str) -> int:
        n, unit = _size_parts(v, key)
        if not unit and 0 < n < MIN_BARE_SIZE:
            raise ConfigError(key, f"{shown(v)} has no unit (bytes then, and under 1MiB surely not meant): "
                                   f"write e.g. \"{n}GiB\", \"{n}MiB\" or \"{n}B\"")
        if not self.lo <= n <= self.hi:
            raise ConfigError(key, f"out of range: {human(n)} (from {human(self.lo)} to {human(self.hi)})")
        return n


def text(v: object, key: str) -> str:
    """string"""
    if not isinstance(v, str):
        raise ConfigError(key, f"expected a string, got {shown(v)}")
    if "\0" in v:
        raise ConfigError(key, f"a NUL character in {shown(v)}")
    return v


def nonempty(v: object, key: str) -> str:
    """string, not empty"""
    if not text(v, key):
        raise ConfigError(key, "empty; leave the key out for the default")
    return str(v)


def program_path(v: object, key: str) -> str:
    """string: a program; where the path exists, a regular file that is executable"""
    path = nonempty(v, key)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return path  # not there (yet): the daemon says so at start (py_spy_missing, austin not found)
    except OSError as exc:
        raise ConfigError(key, f"cannot read {shown(path)}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(key, f"not a regular file: {shown(path)}")
    if not os.access(path, os.X_OK):
        raise ConfigError(key, f"not executable: {shown(path)}")
    return path


def path_or_empty(v: object, key: str) -> str:
    """string: an absolute path, or ``""`` (off)"""
    path = text(v, key)
    if path and not path.startswith("/"):
        raise ConfigError(key, f"a relative path: {shown(path)} (give the full path, or \"\" for no state)")
    return path


def boolean(v: object, key: str) -> bool:
    """boolean"""
    if not isinstance(v, bool):
        raise ConfigError(key, f"expected true or false, got {shown(v)}")
    return v


def string_list(v: object, key: str) -> list[str]:
    """string list"""
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ConfigError(key, "expected a list of strings")
    return [text(x, key) for x in v]


def label(v: object, key: str) -> str:
    """string: a label (1 – 128 printable characters)"""
    problem = label_problem(text(v, key))
    if problem is not None:
        raise ConfigError(key, problem)
    return str(v)


def lookup_user(name: str, key: str = "alerts.hook_user") -> pwd.struct_passwd:
    """The user database's entry for a user name or a numeric UID; ConfigError if none."""
    try:
        return pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, OverflowError, ValueError):
        raise ConfigError(key, f"no such user: {shown(name)}") from None


def user(v: object, key: str) -> str:
    """string: a user that exists"""
    name = text(v, key)
    lookup_user(name, key)
    return name


def group(v: object, key: str) -> str:
    """string: a group that exists (looked up now), or a GID"""
    name = nonempty(v, key)
    if name.isascii() and name.isdigit():  # not "²": str.isdigit() says yes, int() no
        if int(name) > MAX_GID:
            raise ConfigError(key, f"not a GID: {name} (at most {MAX_GID})")
        return name
    try:
        grp.getgrnam(name)
    except (KeyError, ValueError):
        raise ConfigError(key, f"no such group: {shown(name)}") from None
    return name


def hook(v: object, key: str) -> list[str]:
    """string list: a program that exists and is executable, then its arguments"""
    argv = string_list(v, key)
    if not argv:
        raise ConfigError(key, "an empty command; leave the key out for no hook")
    program = argv[0]
    if "/" in program and not program.startswith("/"):
        raise ConfigError(key, f"a relative path: {shown(program)} (the hook runs in /: give the full path)")
    found = shutil.which(program, path=HOOK_PATH) if "/" not in program else program
    if not found or not os.path.isfile(found):
        where = "" if "/" in program else f" (PATH={HOOK_PATH})"
        raise ConfigError(key, f"no such program: {shown(program)}{where}")
    if not os.access(found, os.X_OK):
        raise ConfigError(key, f"not executable: {shown(program)}")
    return argv


class Choice:
    """One of a few words (``"austin"``, ``"dumps"`` or ``"off"``)."""

    def __init__(self, *words: str) -> None:
        self.words = words

    @property
    def said(self) -> str:
        quoted = [f'"{w}"' for w in self.words]
        return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"

    def describe(self) -> str:
        return self.said.replace('"', '`"', 1).replace('"', '"`', 1) if len(self.words) == 1 else \
            ", ".join(f'`"{w}"`' for w in self.words[:-1]) + f' or `"{self.words[-1]}"`'

    def __call__(self, v: object, key: str) -> str:
        if v not in self.words:
            raise ConfigError(key, f"expected {self.said}, got {shown(v)}")
        return str(v)


def budgets(v: object, key: str) -> dict[str, int]:
    """table: label = size"""
    if not isinstance(v, dict):
        raise ConfigError(key, "expected a table of label = size")
    size = Size()
    return {label(name, f"{key}.{name}"): size(value, f"{key}.{name}") for name, value in v.items()}




#: The kernel's range of ``/proc/PID/oom_score_adj``.
OOM_SCORE_ADJ_MIN, OOM_SCORE_ADJ_MAX = -1000, 1000


def oom_scores(v: object, key: str) -> dict[str, int]:
    """table: label = an integer from -1000 to 1000"""
    if not isinstance(v, dict):
        raise ConfigError(key, "expected a table of label = oom_score_adj")
    out: dict[str, int] = {}
    for name, value in v.items():
        where = f"{key}.{name}"
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(where, f"expected an integer from {OOM_SCORE_ADJ_MIN} to {OOM_SCORE_ADJ_MAX}, "
                                     f"got {shown(value)}")
        if not OOM_SCORE_ADJ_MIN <= value <= OOM_SCORE_ADJ_MAX:
            raise ConfigError(where, f"{value} is outside {OOM_SCORE_ADJ_MIN} to {OOM_SCORE_ADJ_MAX}, "
                                     "the kernel's range of oom_score_adj")
        out[label(name, where)] = value
    return out
