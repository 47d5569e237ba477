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
import os
import sys
from collections.abc import Callable, Sequence

from memproto import ProtocolError
from memproto.client_side import ClientError, ClientErrorCode, DaemonNotRunning, RequestFailed
from memproto.paths import socket_path

from .. import __version__
from .. import config as config_file
from ..errors import ConfigError, RecordingUnavailable
from .admit_cmd import COMMANDS as ADMIT_COMMANDS
from .admit_cmd import add_parser as add_admit_parser
from .args import (
    Parser,
    UsageError,
    add_global_options,
    json_parent,
    merge_global_options,
    seconds_arg,
    socket_parent,
    wants_json,
)
from .args import pid_arg as _pid
from .commands import COMMANDS as CLIENT_COMMANDS
from .commands import STATUS_EPILOG
from .daemon_cmd import COMMANDS as DAEMON_COMMANDS
from .daemon_cmd import add_parser as add_daemon_parser
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
from .gate_cmd import COMMANDS as RUN_COMMANDS
from .gate_cmd import add_parser as add_run_parser
from .history_cmd import COMMANDS as HISTORY_COMMANDS
from .history_cmd import add_parser as add_history_parser
from .install_cmd import COMMANDS as INSTALL_COMMANDS
from .install_cmd import add_parsers as add_install_parsers
from .plot_cmd import COMMANDS as PLOT_COMMANDS
from .plot_cmd import add_parser as add_plot_parser
from .record_cmd import COMMANDS as RECORD_COMMANDS
from .record_cmd import add_parser as add_record_parser
from .report_cmd import COMMANDS as REPORT_COMMANDS
from .report_cmd import add_parser as add_report_parser


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="memagent", description="Watch the memory of processes on this box.",
                    epilog="Errors: one line on stderr; exit codes and --json errors: docs/cli.md.")
    parser.add_argument("--version", action="version", version=f"memagent {__version__}")
    add_global_options(parser)
    common = socket_parent()
    client = [common, json_parent()]
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    add_daemon_parser(sub, [common])  # daemon (cli/daemon_cmd.py)
    a = sub.add_parser("attach", parents=client, help="start watching processes")
    a.add_argument("pids", nargs="*", type=_pid, metavar="PID")
    a.add_argument("--label", metavar="NAME")
    a.add_argument("--children", action="store_true", help="also descendants, now and later")
    group = a.add_mutually_exclusive_group()
    group.add_argument("--cgroup", metavar="PATH", help="also every process in this memory cgroup (as /proc/PID/cgroup "
                       "shows it) or below, now and later")
    group.add_argument("--unit", metavar="NAME", help="also every process of this systemd unit, now and later")
    group.add_argument("--container", metavar="NAME|ID", help="also every process of this container, now and later "
                       "(docs/containers.md)")

    dt = sub.add_parser("detach", parents=client, help="stop watching processes")
    dt.add_argument("pids", nargs="*", type=_pid, metavar="PID")
    dt.add_argument("--exited", action="store_true", help="also every exited process")
    ends = dt.add_mutually_exclusive_group()
    for kind, metavar in (("cgroup", "PATH"), ("unit", "NAME"), ("container", "NAME|ID")):
        ends.add_argument(f"--{kind}", metavar=metavar, help=f"end the attach --{kind} rule (yours; any as root) "
                          "and stop watching its processes")

    r = sub.add_parser("reset-peaks", parents=client, help="start a new peak window")
    r.add_argument("pids", nargs="+", type=_pid, metavar="PID")
    r.add_argument("--kernel", action="store_true",
                   help="also reset the kernel's high-water mark (exact at once; resets the process's own "
                        "ru_maxrss; only your own processes, never PID 1)")

    sub.add_parser("ls", parents=client, help="list watched processes")

    sk = sub.add_parser("stack", parents=client, help="Python stacks of a watched process, and where it grew")
    sk.add_argument("pid", type=_pid, metavar="PID")
    sk.add_argument("--cached", action="store_true", help="do not take a fresh dump; show what the daemon has")

    sub.add_parser("status", parents=client, help="the daemon and the host (exit 4/5: an alert is firing)",
                   description="The daemon and the host: headroom, alerts, GPUs, the daemon's own health.",
                   epilog=STATUS_EPILOG)

    cc = sub.add_parser("check-config", help="validate a configuration file")
    cc.add_argument("file", metavar="FILE")

    demo = sub.add_parser("demo", parents=[common], help="run a demo fleet under an agent, print ls each second")
    demo.add_argument("--seconds", type=seconds_arg, default=None, help="stop after this long")
    add_history_parser(sub, client)  # history (cli/history_cmd.py)
    add_record_parser(sub, client)  # record (cli/record_cmd.py)
    add_report_parser(sub, client)  # report (cli/report_cmd.py)
    add_plot_parser(sub, client)  # plot (cli/plot_cmd.py)
    add_run_parser(sub, [common])  # run (cli/gate_cmd.py)
    add_admit_parser(sub, client)  # admit (cli/admit_cmd.py)
    add_install_parsers(sub, build_parser)  # install-service, completion (cli/install_cmd.py)
    return parser


# --------------------------------------------------------------------------- commands


def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        values = config_file.load(args.file)
    except ConfigError as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return EXIT_USAGE  # an invalid configuration, as the daemon refuses it
    print(f"{args.file}: valid ({len(values)} keys set)")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo_printing  # imports the agent (and asyncio): only for this command

    return run_demo_printing(args.socket, args.seconds)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    **DAEMON_COMMANDS,
    **CLIENT_COMMANDS,
    "check-config": cmd_check_config,
    "demo": cmd_demo,
    **HISTORY_COMMANDS,
    **RECORD_COMMANDS,
    **REPORT_COMMANDS,
    **PLOT_COMMANDS,
    **RUN_COMMANDS,
    **ADMIT_COMMANDS,
    **INSTALL_COMMANDS,
}


def _run(argv: Sequence[str], args: argparse.Namespace) -> int:
    """Parse ``argv`` into ``args`` and run its command; errors are the caller's to report."""
    _, extra = build_parser().parse_known_args(argv, namespace=args)
    if extra:  # argparse's own message, but naming the command
        prog = " ".join(("memagent", *([args.command] if getattr(args, "command", None) else [])))
        raise UsageError(prog, f"unrecognized arguments: {' '.join(extra)}", hint=True)
    merge_global_options(args, "memagent")
    return COMMANDS[args.command](args)


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
    sys.exit(main())


if __name__ == "__main__":
    entry()

