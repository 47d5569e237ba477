"""Reading the configuration file: size, encoding and TOML checked, then every key
(:mod:`memagent.config.schema`); each failure is one ConfigError naming the key and its
line, as ``memagent check-config`` and the daemon both say it.

``--config FILE``, else ``/etc/memagent/memagent.toml`` when present. An unknown key or a
wrong value is an error naming the key and its line, so a typo never silently keeps a
default.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from memproto.text import printable

from ..errors import ConfigError
from .checks import MiB
from .schema import SCHEMA, Refused, Schema, Where, check_all

DEFAULT_PATH = "/etc/memagent/memagent.toml"
#: A configuration file is read up to this size: a bigger one is refused (not a config).
MAX_FILE = MiB


def validate(data: dict[str, Any], path: str | None = None, text: str | None = None,
             schema: Schema = SCHEMA) -> dict[str, Any]:
    """The checked values (see :mod:`memagent.config.schema`), flattened to ``section.key``;
    raises ConfigError naming the key, and ``path:LINE`` when the file's ``text`` is given."""
    try:
        return check_all(data, schema)
    except Refused as refused:
        line = None if text is None or path is None else key_line(text, refused.where)
        where = None if path is None else printable(path) if line is None else f"{printable(path)}:{line}"
        raise ConfigError(printable(refused.key), refused.reason, where) from None


def _tomllib() -> Any:
    """The TOML parser, imported once a file is read (``memagent run`` reads none: its
    start-up is its cost, issue 26)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return tomllib


def _holds(text: str, where: Where) -> bool | None:
    """Whether ``text`` (as TOML) sets the key at ``where``; None: it does not parse."""
    try:
        node: object = _tomllib().loads(text)
    except (ValueError, RecursionError):  # tomllib.TOMLDecodeError is a ValueError
        return None
    for name in where:
        if not isinstance(node, dict) or name not in node:
            return False
        node = node[name]
    return True


def key_line(text: str, where: Where) -> int | None:
    """The line (from 1) where the valid TOML ``text`` sets the key at ``where``: the first
    line of its statement (``key = [`` of an array over several lines, the ``[table]``
    header of a table). tomllib gives no positions, so prefixes of the text are parsed: the
    smallest whole-statement prefix that sets the key ends on the statement's last line, and
    the statement starts after the longest prefix before it that parses. None if no prefix
    sets it (a key the file does not hold)."""
    lines = re.findall(r"[^\n]*\n|[^\n]+$", text)  # TOML ends lines at \n only

    def holds(n: int) -> bool | None:
        return _holds("".join(lines[:n]), where)

    if holds(len(lines)) is not True:
        return None
    lo, hi = 0, len(lines)  # no prefix of lo lines or fewer sets the key; that of hi lines does
    while hi - lo > 1:
        mid = (lo + hi) // 2
        probe, state = mid, holds(mid)
        while state is None and probe - 1 > lo:  # inside a statement: the one before it
            probe -= 1
            state = holds(probe)
        if state:
            hi = probe
        else:
            lo = mid
    start = hi - 1  # the longest prefix before the statement that parses
    while start > 0 and holds(start) is None:
        start -= 1
    return start + 1


def load(path: str) -> dict[str, Any]:
    """Read and validate a config file; every failure is one ConfigError (one line)."""
    shown = printable(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE + 1)
    except OSError as exc:
        raise ConfigError("-", f"cannot read: {printable(exc.strerror or str(exc))}", shown) from None
    if len(raw) > MAX_FILE:
        raise ConfigError("-", f"larger than {MAX_FILE // MiB} MiB: not a configuration file", shown)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError("-", f"not UTF-8 text: byte 0x{raw[exc.start]:02x}", f"{shown}:{line}") from None
    tomllib = _tomllib()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        at = re.search(r"\(at line (\d+), column \d+\)$", str(exc))
        raise ConfigError("-", f"not valid TOML: {exc}", f"{shown}:{at.group(1)}" if at else shown) from None
    except RecursionError:
        raise ConfigError("-", "not valid TOML: nested too deeply", shown) from None
    except ValueError:  # int() of a number past sys.get_int_max_str_digits()
        long = re.search(r"[0-9_]{4000,}", text)
        where = shown if long is None else f"{shown}:{text.count(chr(10), 0, long.start()) + 1}"
        raise ConfigError("-", "not valid TOML: a number too long", where) from None
    return validate(data, path, text)


def default_path() -> str | None:
    """The file a daemon given no ``--config`` reads: the default path, when present."""
    return DEFAULT_PATH if os.path.exists(DEFAULT_PATH) else None
