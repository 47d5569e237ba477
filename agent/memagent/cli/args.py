"""Argument rules the ``memagent`` commands share: a parser whose every error is one line
(:class:`UsageError`, never argparse's usage block and exit), the options every client
command takes before **or** after its name (``memagent --socket X ls`` is ``memagent ls
--socket X``), and the types of a PID, a socket path and a duration.

Where a global option is given on both sides of the command, the one after it wins.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple, NoReturn

from memproto.paths import SYSTEM_SOCKET
from memproto.text import printable

from ..errors import ConfigError, MemagentError
from ..gate import BASES, WORST_CASE

# The configuration (its sizes and ranges) is imported by the argument types that use it,
# when a parser that has them is built: ``memagent ls`` never loads it (cli/table.py).

#: Linux's PID_MAX_LIMIT: no PID is above it (and a bigger number does not fit the wire).
PID_MAX = 4_194_304

#: The options of every client command (``dest`` names), accepted before the command too.
GLOBAL_OPTIONS = ("socket", "json")


class UsageError(MemagentError):
    """A bad command line: ``prog`` (``memagent attach``) and what is wrong, one line.
    ``hint``: end the line with where the usage is (argparse's own errors)."""

    code = "usage"  # its --json code (cli.exits.USAGE)

    def __init__(self, prog: str, message: str, hint: bool = False) -> None:
        self.prog = prog
        self.hint = hint
        super().__init__(printable(message))

    @property
    def line(self) -> str:
        return f"{self.prog}: {self}" + (f" (see: {self.prog} --help)" if self.hint else "")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` (and, through ``add_subparsers``, every subparser) that
    raises :class:`UsageError` instead of printing the usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, message, hint=True)


class Parents(NamedTuple):
    """What a command module's ``add_parsers`` builds on (cli/table.py)."""

    #: ``--socket``: every command that talks to (or is) a daemon.
    common: list[Parser]
    #: ``--socket`` and ``--json``: the client commands.
    client: list[Parser]
    #: The whole parser, every command's (the completion script and the man page are made of it).
    whole: Callable[[], argparse.ArgumentParser]


def int_range_arg(lo: int, hi: int, what: str, *, say_range: bool = False) -> Callable[[str], int]:
    """The type of an integer argument from ``lo`` to ``hi``: else ``not WHAT: 'TEXT'``
    (``say_range``: with `` (LO to HI)`` after it when the number is out of range)."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}" + (f" ({lo} to {hi})" if say_range else ""))
        return n

    return parse


pid_arg = int_range_arg(1, PID_MAX, "a PID", say_range=True)


def add_selection_arguments(parser: argparse.ArgumentParser, *, label: bool = True,
                            pid_help: str = "only this process (repeatable)") -> None:
    """``[--pid PID …] [--label L …]`` (``label``: with ``--label``): the processes a command
    reads or records (``plot``, ``report``, ``record``), into ``args.pid`` and ``args.label``."""
    parser.add_argument("--pid", type=pid_arg, action="append", default=[], metavar="PID", help=pid_help)
    if label:
        parser.add_argument("--label", action="append", default=[], metavar="LABEL",
                            help="only the processes with this label (repeatable)")


def add_basis_argument(parser: argparse.ArgumentParser) -> None:
    """``--basis worst-case|observed`` (``admit``, ``run --fits``): which bound decides the
    exit status; both are answered (docs/headroom.md, "Two bounds")."""
    parser.add_argument("--basis", choices=BASES, default=WORST_CASE,
                        help="the bound the exit status follows: worst-case (Σ peaks, the default) or observed "
                             "(the highest total seen together)")


def socket_arg(value: str) -> str:
    if not value:
        raise argparse.ArgumentTypeError("an empty path")
    return value


def seconds_arg(value: str) -> float:
    """A finite duration above 0."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not math.isfinite(x) or x <= 0:
        raise argparse.ArgumentTypeError(f"not a finite number of seconds above 0: {value!r}")
    return x


SOCKET_HELP = f"daemon socket (default: $MEMAGENT_SOCKET, else {SYSTEM_SOCKET}, else per user; docs/cli.md)"
JSON_HELP = "print JSON on stdout, errors too ({\"error\": {...}}; see docs/cli.md)"


def socket_parent() -> Parser:
    """The parent of every command that talks to (or is) a daemon: ``--socket``."""
    parent = Parser(add_help=False)
    parent.add_argument("--socket", type=socket_arg, metavar="PATH", help=SOCKET_HELP)
    return parent


def json_parent() -> Parser:
    """The parent of every client command: ``--json``."""
    parent = Parser(add_help=False)
    parent.add_argument("--json", action="store_true", help=JSON_HELP)
    return parent


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """The client commands' options on the top-level parser, under other ``dest`` names
    (and no default) so that :func:`merge_global_options` knows where each was given."""
    group = parser.add_argument_group("options of the client commands (before or after COMMAND)")
    group.add_argument("--socket", dest="global_socket", type=socket_arg, metavar="PATH",
                       default=argparse.SUPPRESS, help=SOCKET_HELP)
    group.add_argument("--json", dest="global_json", action="store_true", default=argparse.SUPPRESS,
                       help=JSON_HELP)


def merge_global_options(args: argparse.Namespace, prog: str) -> None:
    """Move the options given before the command to where the command reads them; a
    :class:`UsageError` for one the command does not take (``memagent --json daemon``)."""
    for name in GLOBAL_OPTIONS:
        key = f"global_{name}"
        if not hasattr(args, key):
            continue
        value = getattr(args, key)
        delattr(args, key)
        if not hasattr(args, name):
            raise UsageError(f"{prog} {args.command}", f"--{name} is not an option of {args.command}", hint=True)
        if getattr(args, name) in (None, False):  # given after the command: that one wins
            setattr(args, name, value)


def wants_json(argv: Sequence[str]) -> bool:
    """Whether the command line asks for ``--json`` (an unambiguous prefix counts, as for
    argparse): read before parsing, so that a usage error is JSON too."""
    for token in argv:
        if token == "--":
            return False
        if token.startswith("--j") and "--json".startswith(token):
            return True
    return False


def size_arg(text: str) -> int:
    """A size as the configuration reads one (``512MiB``, ``2G``, bytes)."""
    from ..config import parse_size

    try:
        return parse_size(text, "SIZE")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(printable(exc.reason)) from None


def size_range_arg(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """The type of a size argument from ``lo`` to ``hi`` bytes (default: the configuration's
    largest size; ``run``'s budgets, ``admit``'s peaks: a budget of 0 bytes is over at once,
    a meaningless gate)."""
    from ..config import MAX_SIZE
    from ..config.checks import human

    hi = MAX_SIZE if hi is None else hi

    def parse(text: str) -> int:
        n = size_arg(text)
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"out of range: {text!r} ({human(lo)} to {human(hi)})")
        return n

    return parse


def float_range_arg(lo: float, hi: float, what: str, unit: str = "") -> Callable[[str], float]:
    """The type of a finite number argument from ``lo`` to ``hi`` (nan, inf, and a value
    out of range refused: ``--interval 1e-9`` would spin the agent's sampler)."""
    shown_unit = f" {unit}" if unit else ""

    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not math.isfinite(x) or not lo <= x <= hi:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r} ({lo:g} to {hi:g}{shown_unit})")
        return x

    return parse


def config_range_arg(key: str, what: str) -> Callable[[str], float]:
    """:func:`float_range_arg` with the range of the configuration's number ``key``
    (``run --interval``: the daemon's ``interval``, its range declared once, there)."""
    from ..config import check_of
    from ..config.checks import Number

    check = check_of(key)
    assert isinstance(check, Number), key
    return float_range_arg(check.lo, check.hi, what, check.unit)
