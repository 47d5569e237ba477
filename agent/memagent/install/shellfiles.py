"""Files made from the ``memagent`` argument parser itself, so they never drift from it:
shell completion for bash and zsh (through ``shtab``, one pure-Python module without
dependencies) and the man page (``memagent(1)``, roff written here: a few lines, where
``argparse-manpage`` ships no wheel and breaks a help line that starts with a quote).

``memagent completion bash|zsh`` prints the script; ``memagent install-service`` writes
both and the man page (:mod:`.installer`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .. import __version__
from ..errors import MemagentError
from . import SHELLS as SHELLS  # the shells a completion script is made for

#: Argument names (metavars) whose values are files or directories: completed as such.
FILE_METAVARS = frozenset({"FILE", "PATH"})
DIR_METAVARS = frozenset({"DIR"})


class CompletionUnavailable(MemagentError):
    """The ``shtab`` package is not installed: no completion script can be made."""


@dataclass(frozen=True)
class CommandLine:
    """What the files are made from: the whole parser, and what each exit status means
    (the command line's, :data:`memagent.cli.exits.EXIT_STATUS_MAN`), both given by the
    command line so that this room never imports it."""

    parser: argparse.ArgumentParser
    exit_statuses: Sequence[tuple[int, str]]


# --------------------------------------------------------------------------- walking the parser


def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """Each command of ``parser``: its name, its one-line help and its parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _options(parser: argparse.ArgumentParser, with_help: bool) -> Iterator[argparse.Action]:
    """The arguments of ``parser`` worth a line: positionals first, ``--help`` only if asked."""
    shown = [a for a in parser._actions if a.help != argparse.SUPPRESS
             and not isinstance(a, argparse._SubParsersAction)
             and (with_help or not isinstance(a, argparse._HelpAction))]
    yield from sorted(shown, key=lambda a: bool(a.option_strings))


def _all_actions(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    yield from parser._actions
    for _, _, sub in subcommands(parser):
        yield from _all_actions(sub)


# --------------------------------------------------------------------------- completion


def completion(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser`` for ``shell`` (``bash`` or ``zsh``)."""
    try:
        import shtab  # only for this: the rest of the CLI never needs it
    except ImportError:
        raise CompletionUnavailable("the shtab package is not installed (pip install shtab)") from None
    for action in _all_actions(parser):  # what shtab reads to complete a value as a path
        metavar = action.metavar if isinstance(action.metavar, str) else ""
        if metavar in FILE_METAVARS:
            setattr(action, "complete", shtab.FILE)  # noqa: B010 - not an attribute argparse declares
        elif metavar in DIR_METAVARS:
            setattr(action, "complete", shtab.DIRECTORY)  # noqa: B010
    script: str = shtab.complete(parser, shell=shell)
    return script


# --------------------------------------------------------------------------- the man page


def roff(text: str) -> str:
    """Plain text as roff: backslashes and hyphens escaped, no line read as a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(f"\\&{line}" if line.startswith((".", "'")) else line for line in text.splitlines())


def _usage(parser: argparse.ArgumentParser) -> str:
    """The parser's usage on one line, without ``usage:`` or its program name."""
    formatter = argparse.HelpFormatter(parser.prog, width=10_000)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return formatter.format_help().strip().removeprefix(parser.prog).strip()


def _option_lines(parser: argparse.ArgumentParser, with_help: bool = False) -> list[str]:
    lines = []
    for action in _options(parser, with_help):
        metavar = action.metavar or action.dest.upper()
        value = f" \\fI{roff(str(metavar))}\\fR" if action.nargs != 0 else ""
        if action.option_strings:
            names = ", ".join(f"\\fB{roff(o)}\\fR" for o in action.option_strings)
        else:
            names, value = f"\\fI{roff(str(metavar))}\\fR", ""
        lines += [".TP", names + value, roff(action.help or "") or "\\&"]
    return lines


ENVIRONMENT = (
    ("MEMAGENT_SOCKET", "The daemon's socket when \\fB\\-\\-socket\\fR is not given."),
    ("MEMAGENT_DAEMON_UID", "A UID, besides root and the client's own, whose daemon the client trusts."),
    ("XDG_RUNTIME_DIR", "Where a user's own daemon puts its socket."),
)


def man_page(command_line: CommandLine, files: Sequence[tuple[str, str]]) -> str:
    """``memagent(1)``: every command and option of the parser, the exit statuses, and
    ``files`` (path, what it is)."""
    parser = command_line.parser
    prog = parser.prog
    summary = (parser.description or "").rstrip(".")
    out = [f'.TH {prog.upper()} 1 "" "{prog} {__version__}" "User Commands"',
           ".SH NAME", f"{prog} \\- {roff(summary[:1].lower() + summary[1:])}",
           ".SH SYNOPSIS", f".B {prog}", roff(_usage(parser)),
           ".SH DESCRIPTION", roff(parser.description or ""),
           "Every error is one line on standard error, never a traceback; with \\fB\\-\\-json\\fR it is also "
           "a JSON object on standard output.",
           ".SH OPTIONS", *_option_lines(parser, with_help=True),
           ".SH COMMANDS"]
    for name, help_text, sub in subcommands(parser):
        out += [f'.SS "{roff(f"{prog} {name}")}"', f".B {roff(f'{prog} {name}')}", roff(_usage(sub)),
                ".PP", roff(sub.description or help_text)]
        if sub.epilog:
            out += [".PP", roff(sub.epilog)]
        out += _option_lines(sub)
    out.append(".SH EXIT STATUS")
    for code, meaning in command_line.exit_statuses:
        out += [".TP", f"\\fB{code}\\fR", meaning]
    out.append(".SH ENVIRONMENT")
    for var, meaning in ENVIRONMENT:
        out += [".TP", f"\\fB{var}\\fR", meaning]
    out.append(".SH FILES")
    for path, what in files:
        out += [".TP", f"\\fI{roff(path)}\\fR", roff(what)]
    out += [".SH SEE ALSO", "\\fBmemtop\\fR(1), \\fBsystemctl\\fR(1), \\fBjournalctl\\fR(1); "
            "in the docs (FILES): cli.md, service.md, configuration.md, security.md."]
    return "\n".join(out) + "\n"
