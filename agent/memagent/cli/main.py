"""The ``memagent`` command line. Its commands, flags, exit codes and JSON fields are a
contract that scripts rely on: extend, never rename.

Exit codes: 0 success; 1 a request failed for some PID (``no such process: PID``,
``permission denied: PID`` on stderr); 2 no daemon (``no memagent daemon at PATH (start
one with: memagent daemon)``) or a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

from memproto import ProtocolError
from memproto.client_side import ConnectionLost, DaemonNotRunning, RequestFailed
from memproto.paths import socket_path
from memproto.records import Failure
from memproto.schema import to_wire
from memproto.text import label_problem, printable
from memproto.vocabulary import ErrorCode, StackState

from .. import __version__
from .. import config as config_file
from ..config import DEFAULT_PATH as DEFAULT_CONFIG
from ..errors import ConfigError
from .client import Client
from .render import format_stack, format_table, frame_text, human_bytes, process_json, status_lines

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_NO_DAEMON = 2
EXIT_USAGE = 2


#: Linux's PID_MAX_LIMIT: no PID is above it (and a bigger number does not fit the wire).
PID_MAX = 4_194_304


def _pid(value: str) -> int:
    try:
        pid = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a PID: {value!r}") from None
    if not 0 < pid <= PID_MAX:
        raise argparse.ArgumentTypeError(f"not a PID: {value!r}")
    return pid


def _positive(value: str) -> float:
    x = float(value)
    if x <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return x


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memagent", description="Watch the memory of processes on this box.")
    parser.add_argument("--version", action="version", version=f"memagent {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--socket", metavar="PATH", help="daemon socket (default: $MEMAGENT_SOCKET, then per user)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = sub.add_parser("daemon", parents=[common], help="run the agent in the foreground")
    d.add_argument("--config", metavar="FILE", help=f"TOML configuration (default: {DEFAULT_CONFIG} if present)")
    d.add_argument("--interval", type=_positive, metavar="SECONDS", help="sample interval (0.5)")
    d.add_argument("--auto", action="append", metavar="PATTERN",
                   help="attach every process whose executable name matches (repeatable), e.g. 'python*'")
    d.add_argument("--auto-label", metavar="NAME", help="label for auto-attached processes")
    d.add_argument("--admin-group", metavar="GROUP", help="members see every process, as root does")
    d.add_argument("--socket-group", metavar="GROUP", help="group of the socket file: its members may connect")
    d.add_argument("--history", type=_positive, metavar="SECONDS", help="history kept (600)")
    d.add_argument("--status-refresh", type=_positive, metavar="SECONDS",
                   help="longest time between two reads of an unchanged process's kernel peak and swap (1)")
    d.add_argument("--no-gpu", action="store_true", help="do not read GPU memory through NVML")
    d.add_argument("--no-netlink", action="store_true",
                   help="do not listen to the kernel's process events (fork, exec, exit records): poll /proc only")
    d.add_argument("--no-stacks", action="store_true", help="do not read Python stacks with py-spy")
    d.add_argument("--py-spy", metavar="PATH", help="py-spy executable (default: on PATH, then beside Python)")
    d.add_argument("--stack-budget", type=_positive, metavar="PER_SECOND",
                   help="py-spy dumps per second for the whole box (4)")
    d.add_argument("--stack-timeout", type=_positive, metavar="SECONDS",
                   help="a py-spy dump taking longer is killed (2)")
    d.add_argument("-v", "--verbose", action="store_true")

    a = sub.add_parser("attach", parents=[common], help="start watching processes")
    a.add_argument("pids", nargs="+", type=_pid, metavar="PID")
    a.add_argument("--label", metavar="NAME")
    a.add_argument("--children", action="store_true", help="also descendants, now and later")
    a.add_argument("--json", action="store_true")

    dt = sub.add_parser("detach", parents=[common], help="stop watching processes")
    dt.add_argument("pids", nargs="*", type=_pid, metavar="PID")
    dt.add_argument("--exited", action="store_true", help="also every exited process")
    dt.add_argument("--json", action="store_true")

    r = sub.add_parser("reset-peaks", parents=[common], help="start a new peak window")
    r.add_argument("pids", nargs="+", type=_pid, metavar="PID")
    r.add_argument("--kernel", action="store_true",
                   help="also reset the kernel's high-water mark (exact at once; resets the process's own "
                        "ru_maxrss; only your own processes, never PID 1)")
    r.add_argument("--json", action="store_true")

    ls = sub.add_parser("ls", parents=[common], help="list watched processes")
    ls.add_argument("--json", action="store_true")

    sk = sub.add_parser("stack", parents=[common], help="Python stacks of a watched process, and where it grew")
    sk.add_argument("pid", type=_pid, metavar="PID")
    sk.add_argument("--cached", action="store_true", help="do not take a fresh dump; show what the daemon has")
    sk.add_argument("--json", action="store_true")

    st = sub.add_parser("status", parents=[common], help="the daemon and the host")
    st.add_argument("--json", action="store_true")

    cc = sub.add_parser("check-config", help="validate a configuration file")
    cc.add_argument("file", metavar="FILE")

    demo = sub.add_parser("demo", parents=[common], help="run a demo fleet under an agent, print ls each second")
    demo.add_argument("--seconds", type=_positive, default=None, help="stop after this long")
    return parser


# --------------------------------------------------------------------------- output


def _print_json(value: object) -> None:
    json.dump(value, sys.stdout, indent=None)
    sys.stdout.write("\n")


def _report_failures(failed: list[Failure]) -> int:
    for f in failed:
        plain = f.code in (ErrorCode.NO_SUCH_PROCESS, ErrorCode.PERMISSION_DENIED)
        message = printable(f.message)
        print(message if plain else f"{printable(f.code)}: {message}", file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


# --------------------------------------------------------------------------- commands


def _connect(args: argparse.Namespace) -> Client:
    return Client(socket_path(args.socket))


def _results(args: argparse.Namespace, items: Sequence[T], as_json: Callable[[T], object],
             as_text: Callable[[T], str], failed: list[Failure]) -> int:
    """Print what a per-PID request did (``--json``: one array), then its failures."""
    if args.json:
        _print_json([as_json(item) for item in items])
    else:
        for item in items:
            print(as_text(item))
    return _report_failures(failed)


def cmd_attach(args: argparse.Namespace) -> int:
    problem = None if args.label is None else label_problem(args.label)
    if problem is not None:
        print(f"memagent attach: --label: {problem}", file=sys.stderr)
        return EXIT_USAGE
    with _connect(args) as c:
        reply = c.attach(args.pids, args.label, args.children)
    return _results(args, reply.attached, process_json,
                    lambda p: f"attached {p.pid} ({printable(p.label or p.name)})", reply.failed)


def cmd_detach(args: argparse.Namespace) -> int:
    if not args.pids and not args.exited:
        print("memagent detach: give PIDs or --exited", file=sys.stderr)
        return EXIT_NO_DAEMON
    with _connect(args) as c:
        reply = c.detach(args.pids, args.exited)
    return _results(args, reply.detached, lambda r: {"pid": r.pid, "start_time": r.start_time},
                    lambda r: f"detached {r.pid}", reply.failed)


def cmd_reset_peaks(args: argparse.Namespace) -> int:
    with _connect(args) as c:
        reply = c.reset_peaks(args.pids, kernel=args.kernel)
    return _results(args, reply.reset, process_json,
                    lambda p: f"peak of {p.pid} reset to {human_bytes(p.rss_peak_bytes)}"
                              + ("" if p.rss_peak_exact else " (sampled until it passes the kernel's mark)"),
                    reply.failed)


def cmd_ls(args: argparse.Namespace) -> int:
    with _connect(args) as c:
        processes = c.list()
    if args.json:
        _print_json([process_json(p) for p in processes])
    else:
        print(format_table(processes))
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    with _connect(args) as c:
        status = c.status()
    if args.json:
        _print_json(to_wire(status))
        return EXIT_OK
    print("\n".join(status_lines(status)))
    return EXIT_OK


def cmd_stack(args: argparse.Namespace) -> int:
    with Client(socket_path(args.socket), timeout=30.0) as c:
        reply = c.stack(args.pid, fresh=not args.cached)
    status = EXIT_OK if reply.state in (StackState.OK, StackState.EXITED) or reply.latest else EXIT_FAILED
    if args.json:
        _print_json({k: v for k, v in to_wire(reply).items() if k != "id"})
        return status
    print(f"{reply.pid}: stack state {reply.state}" + (f": {printable(reply.message)}" if reply.message else ""))
    if reply.latest:
        print("\n".join(format_stack(reply.latest, "latest stack")))
    if reply.at_peak and reply.at_peak != reply.latest:
        print("\n".join(format_stack(reply.at_peak, "stack at peak")))
    if reply.by_line:
        print("where memory grew (attributed to the next stack taken; correlation, not proof):")
        for s in reply.by_line[:10]:
            print(f"  {human_bytes(s.bytes):>10}  {s.samples:>4}x  {frame_text(s.function, s.filename, s.line)}")
    return status


def cmd_daemon(args: argparse.Namespace) -> int:
    from ..daemon import run_daemon, setup_logging, skip_tls_import

    skip_tls_import()

    setup_logging(args.verbose)
    path = args.config or config_file.default_path()
    try:
        values = config_file.load(path) if path else {}
    except ConfigError as exc:
        print(f"memagent: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_NO_DAEMON
    socket = socket_path(args.socket or values.get("socket"))
    return run_daemon(config_file.agent_config(values, vars(args), socket))


def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        values = config_file.load(args.file)
    except ConfigError as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{args.file}: valid ({len(values)} keys set)")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo_printing  # imports the agent (and asyncio): only for this command

    return run_demo_printing(args.socket, args.seconds)


COMMANDS = {
    "daemon": cmd_daemon,
    "attach": cmd_attach,
    "detach": cmd_detach,
    "reset-peaks": cmd_reset_peaks,
    "ls": cmd_ls,
    "status": cmd_status,
    "stack": cmd_stack,
    "check-config": cmd_check_config,
    "demo": cmd_demo,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except DaemonNotRunning as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_NO_DAEMON
    except (RequestFailed, ProtocolError, ConnectionLost, TimeoutError) as exc:
        print(f"memagent: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except PermissionError as exc:
        print(f"memagent: cannot connect to {socket_path(args.socket)}: {exc.strerror}", file=sys.stderr)
        return EXIT_NO_DAEMON
    except BrokenPipeError:
        # stdout closed early (| head): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        return 130


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()

