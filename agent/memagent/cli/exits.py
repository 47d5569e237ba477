"""How a ``memagent`` command ends: its exit code, its one line on stderr and, with
``--json``, the same error as JSON on stdout. These are a contract (docs/cli.md).

Exit codes: 0 done; 1 a request failed, for some PID or as a whole, or the daemon was
lost; 2 no daemon reachable at the socket, or a usage error; 4 ``status``: a warning
alert is firing; 5 ``status``: a critical alert is firing; 130 interrupted (Ctrl-C).

The JSON error object: ``{"error": {"code": CODE, "message": TEXT, "pid": PID or null}}``;
``code`` is the daemon's (:class:`memproto.vocabulary.ErrorCode`, with underscores) when
the daemon sent one, else the client's (:class:`memproto.client_side.ClientErrorCode`,
and :data:`USAGE`, :data:`UNEXPECTED` here). A request over several PIDs that failed for
some of them adds ``"failures"``, one such object per failed PID (:func:`results`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

from memproto.text import printable
from memproto.vocabulary import ErrorCode

# The commands' failure, raised by the rooms too, is declared in errors.py; the commands take it from here.
from ..errors import CANNOT_WRITE as CANNOT_WRITE
from ..errors import NO_RECORDING as NO_RECORDING
from ..errors import CommandFailed as CommandFailed

if TYPE_CHECKING:
    from memproto.records import Failure

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_NO_DAEMON: Final = 2
EXIT_USAGE: Final = 2
#: ``run``: over budget (unless --over-budget-status says otherwise); ``admit``: does not fit.
EXIT_OVER_BUDGET: Final = 3
EXIT_WARNING: Final = 4
EXIT_CRITICAL: Final = 5
EXIT_INTERRUPTED: Final = 130

#: The command line itself is wrong (exit 2).
USAGE: Final = "usage"
#: The command failed in a way it does not expect: a bug of the client (exit 1).
UNEXPECTED: Final = "unexpected"

#: What each exit status means, as the man page says it (roff; docs/cli.md, where the contract is
#: written out): given to :func:`memagent.install.shellfiles.man_page`.
EXIT_STATUS_MAN: Final = (
    (EXIT_OK, "Done. \\fBstatus\\fR: no alert is firing."),
    (EXIT_FAILED, "A request failed, for some PID or as a whole; the connection was lost or timed out; "
                  "the daemon is not trusted; \\fBdaemon\\fR cannot listen; \\fBinstall\\-service\\fR: not root, "
                  "or a file or group could not be written."),
    (EXIT_NO_DAEMON, "No daemon reachable at the socket; a usage error; an invalid configuration."),
    (EXIT_WARNING, "\\fBstatus\\fR: a warning alert is firing."),
    (EXIT_CRITICAL, "\\fBstatus\\fR: a critical alert is firing."),
    (EXIT_INTERRUPTED, "Interrupted (Ctrl\\-C)."),
)


def finish(as_json: bool, prog: str, work: Callable[[], tuple[dict[str, object], str]]) -> int:
    """Run ``work``, which returns what it did as JSON and as a line for people, and
    print one of them; a :class:`CommandFailed` becomes its line (and JSON error) and status."""
    try:
        done, line = work()
    except CommandFailed as exc:
        fail(as_json, f"{prog}: {exc}", exc.code, str(exc))
        return exc.status
    if as_json:
        print_json(done)
    else:
        print(printable(line))
    sys.stdout.flush()
    return EXIT_OK


def print_json(value: object) -> None:
    json.dump(value, sys.stdout, indent=None)
    sys.stdout.write("\n")


def error_json(code: str, message: str, pid: int | None = None) -> dict[str, object]:
    return {"code": code, "message": message, "pid": pid}


def fail(as_json: bool, line: str, code: str, message: str, pid: int | None = None) -> None:
    """One error: ``line`` on stderr (made printable); with ``as_json`` the error object on
    stdout too."""
    print(printable(line), file=sys.stderr)
    if as_json:
        print_json({"error": error_json(code, message, pid)})


def failure_line(f: Failure) -> str:
    plain = f.code in (ErrorCode.NO_SUCH_PROCESS, ErrorCode.PERMISSION_DENIED)
    message = printable(f.message)
    return message if plain else f"{printable(f.code)}: {message}"


def results(as_json: bool, key: str, done: Sequence[object], lines: Sequence[str], failed: list[Failure]) -> int:
    """What a per-PID request did, then its failures, one line each on stderr.

    ``--json``: everything done, the array ``done``, when nothing failed; when some PIDs
    failed, ``{KEY: done, "failures": [...]}`` if anything was done, else ``{"error":
    <the first failure>, "failures": [...]}``; exit 1 in both cases."""
    failures = [error_json(f.code, f.message, f.pid) for f in failed]
    if as_json:
        if not failed:
            print_json(list(done))
        elif done:
            print_json({key: list(done), "failures": failures})
        else:
            print_json({"error": failures[0], "failures": failures})
    else:
        for line in lines:
            print(line)
    for f in failed:
        print(failure_line(f), file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK
