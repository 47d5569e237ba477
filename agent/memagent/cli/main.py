"""The ``memagent`` command line. Its commands, flags, exit codes and JSON fields are a
contract that scripts rely on: extend, never rename.

Exit codes: 0 success; 1 a request failed for some PID (``no such process: PID``,
``permission denied: PID`` on stderr) or as a whole; 2 no daemon (``no memagent daemon at
PATH (start one with: memagent daemon)``) or a usage error; ``status`` 4 or 5: a warning or
a critical alert is firing. Every error is one line on stderr, and with ``--json`` a JSON
object on stdout too (:mod:`.report`, docs/cli.md). The client commands are in
:mod:`.commands`, the shared argument rules (global options before or after the command)
in :mod:`.args`.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import NoReturn

from memproto import ProtocolError
from memproto.client_side import ClientError, ClientErrorCode, DaemonNotRunning, RequestFailed
from memproto.paths import socket_path

from .. import __version__
from ..errors import RecordingUnavailable
from .args import (
    Parents,
    Parser,
    UsageError,
    add_global_options,
    json_parent,
    merge_global_options,
    socket_parent,
    wants_json,
)
from .exits import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NO_DAEMON,
    EXIT_OK,
    EXIT_USAGE,
    NO_RECORDING,
    UNEXPECTED,
    USAGE,
    fail,
)
from .table import TABLE

#: ``build_parser(only=NO_COMMAND)``: every command a stub (the first pass over argv).
NO_COMMAND = ""


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"{__package__}.{name}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command (``only=None``: for the completion script and the man
    page); of every command as a stub with its help (``only=NO_COMMAND``: ``memagent
    --help``, argparse's choices and its messages); or of command ``only`` and its module's
    others alone (the command is known to be one: 20 stubs fewer to build)."""
    parser = Parser(prog="memagent", description="Watch the memory of processes on this box.",
                    epilog="Errors: one line on stderr; exit codes and --json errors: docs/cli.md.")
    parser.add_argument("--version", action="version", version=f"memagent {__version__}")
    add_global_options(parser)
    common = socket_parent()
    parents = Parents([common], [common, json_parent()], build_parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = None if only is None else TABLE[only].module if only in TABLE else NO_COMMAND
    added: set[str] = set()
    for name, command in TABLE.items():
        if chosen is not None and command.module != chosen:
            if chosen == NO_COMMAND:
                sub.add_parser(name, help=command.help, add_help=False)
        elif command.module not in added:  # a module adds all its commands, in the table's order
            added.add(command.module)
            _module(command.module).add_parsers(sub, parents)
    return parser


def command_named(argv: Sequence[str]) -> str | None:
    """The command ``argv`` plainly names: its first word, after nothing but global options
    spelt in full (``--json``, ``--socket PATH``, ``--socket=PATH``); else None (``--help``,
    ``--version``, an abbreviated option, no command or an unknown one), for argparse to
    answer."""
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--json" or token.startswith("--socket="):
            i += 1
        elif token == "--socket":
            i += 2
        else:
            return token if token in TABLE else None
    return None


def _run(argv: Sequence[str], args: argparse.Namespace) -> int:
    """Parse ``argv`` into ``args`` and run its command; errors are the caller's to report.
    A first pass over stubs finds the command (and answers ``--help`` and ``--version``),
    unless :func:`command_named` sees it at once; only its own module is imported and
    parses (cli/table.py)."""
    command = command_named(argv)
    if command is None:
        command = build_parser(only=NO_COMMAND).parse_known_args(argv)[0].command
    _, extra = build_parser(only=command).parse_known_args(argv, namespace=args)
    if extra:  # argparse's own message, but naming the command
        prog = " ".join(("memagent", *([args.command] if getattr(args, "command", None) else [])))
        raise UsageError(prog, f"unrecognized arguments: {' '.join(extra)}", hint=True)
    merge_global_options(args, "memagent")
    run: Callable[[argparse.Namespace], int] = _module(TABLE[args.command].module).COMMANDS[args.command]
    return run(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command: every error ends here as one line on stderr (and, with ``--json``,
    as an error object on stdout), never as a traceback."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = argparse.Namespace()
    code, message, line, pid, status = USAGE, "", "", None, EXIT_FAILED
    try:
        return _run(argv, args)
    except UsageError as exc:
        code, message, line, status = USAGE, str(exc), exc.line, EXIT_USAGE
    except DaemonNotRunning as exc:
        code, message, status = exc.code, str(exc), EXIT_NO_DAEMON
        line = message
    except ClientError as exc:  # CannotConnect: 2; RequestFailed, ConnectionLost, UntrustedDaemon: 1
        code, message, line = exc.code, str(exc), f"memagent: {exc}"
        if isinstance(exc, RequestFailed):  # the daemon refused a request about one PID (stack): it names it
            pid = getattr(args, "pid", None)
        status = EXIT_NO_DAEMON if code == ClientErrorCode.CANNOT_CONNECT else EXIT_FAILED
    except RecordingUnavailable as exc:  # history, report: no recording to read (exit 1)
        code, message = NO_RECORDING, str(exc)
        line = f"memagent {args.command}: {message}"
    except ProtocolError as exc:
        code, message = ClientErrorCode.BAD_REPLY, str(exc)
        line = f"memagent: {message}"
    except TimeoutError:
        path = socket_path(getattr(args, "socket", None))
        code, message = ClientErrorCode.TIMEOUT, f"no answer in time from the daemon at {path}"
        line = f"memagent: {message}"
    except BrokenPipeError:  # stdout closed early (| head): not an error of ours
        _drop_stdout()
        return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - a bug of ours: still one line, never a traceback
        code, message = UNEXPECTED, f"unexpected {type(exc).__name__}: {exc} (a bug of memagent: please report it)"
        line = f"memagent: {message}"
    try:
        fail(bool(getattr(args, "json", False)) or wants_json(argv), line, code, message, pid)
    except BrokenPipeError:
        _drop_stdout()
    return status


def _drop_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered for a closed pipe goes nowhere
    (else Python reports the broken pipe once more at exit)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def entry() -> None:
    """The ``memagent`` command (and ``python -m memagent.cli``): :func:`main`, then :func:`exit_now`."""
    exit_now(main())


def exit_now(status: int) -> NoReturn:
    """End as ``sys.exit(status)`` does (the ``atexit`` functions run, stdout and stderr
    flushed) without the interpreter's teardown: freeing its modules and ~25,000 objects
    one by one, which the kernel does at once, costs ~30 ms, a sixth of ``memagent run``'s
    own overhead (issue 26). While another thread runs (Python would wait for it), or when a
    flush fails (Python reports it, exit status 120), the usual exit."""
    if threading.active_count() == 1:
        atexit._run_exitfuncs()  # what Python runs at exit; then none are left to run twice
        try:
            for stream in (sys.stdout, sys.stderr):
                if stream is not None:
                    stream.flush()
        except (OSError, ValueError):
            pass
        else:
            os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    entry()

