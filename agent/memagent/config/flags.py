"""The daemon's flags, derived from the keys that declare one (:class:`~memagent.config.keys.Flag`).

Every flag's type is the check of the configuration key it sets (the same ranges as the
file), so a flag and a file key can never disagree on what is valid; the flag's value
reaches its field through :func:`memagent.config.source.agent_config`, under the name
argparse gives it (:attr:`~memagent.config.keys.Flag.dest`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from memproto.text import printable

from ..errors import ConfigError
from .keys import Key, Table
from .schema import text_value
from .sections import KEYS


def setting(k: Key, one: bool = False) -> Callable[[str], object]:
    """The type of a daemon flag: its text through the check of the file's key ``k`` (the
    same ranges), so ``--interval nan`` is "argument --interval: not a finite number: 'nan'";
    ``one``: the flag gives one item of a list key (a repeatable flag)."""

    def convert(text: str) -> object:
        try:
            value = text_value(k.check, k.file, text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(printable(exc.reason)) from None
        return value[0] if one else value

    convert.__name__ = k.file
    return convert


def add_flags(parser: argparse.ArgumentParser, table: Table = KEYS) -> None:
    """One argument of ``parser`` per key of ``table`` that has a flag, in table order."""
    for row in table:
        k, f = row.key, row.key.flag
        if f is None:
            continue
        if f.switch_off:
            parser.add_argument(*f.names, action="store_true", help=f.help)
            continue
        options: dict[str, object] = {"help": f.help}
        if f.checked:
            options["type"] = setting(k, one=f.repeat)
        if f.repeat:
            options["action"] = "append"
        if f.metavar is not None:
            options["metavar"] = f.metavar
        if f.choices is not None:
            options["choices"] = f.choices
        parser.add_argument(*f.names, **options)  # type: ignore[arg-type]
