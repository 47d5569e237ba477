"""The client commands (attach, detach, reset-peaks, ls, stack, status) and the two light
local ones (check-config, demo): their parsers and what runs them. A client command sends
its requests through :class:`~.client.Client` and prints text for people (:mod:`.render`)
or, with ``--json``, the wire records (:func:`memproto.schema.to_wire`). Errors are raised,
and reported once by ``main``; per-PID failures are reported here (:func:`.exits.results`).
What only check-config and demo use (the configuration, the agent) is imported when they run."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from memproto.schema import to_wire
from memproto.text import label_problem, printable
from memproto.vocabulary import Severity, StackState

from ..client import Client, connect
from ..prose import human_bytes
from .args import Parents, Parser, UsageError, seconds_arg
from .args import pid_arg as _pid
from .exits import EXIT_CRITICAL, EXIT_FAILED, EXIT_OK, EXIT_USAGE, EXIT_WARNING, print_json, results
from .render import format_table, process_json, stack_reply_lines, status_lines
from .table import help_of

if TYPE_CHECKING:
    from memproto.records import DaemonStatus

STATUS_EPILOG = (f"exit status (a health check): {EXIT_OK} no alert firing, {EXIT_WARNING} a warning alert is "
                 f"firing, {EXIT_CRITICAL} a critical alert is firing (the most severe counts; with --json too); "
                 "2 no daemon or a usage error, 1 another failure")


def _connect(args: argparse.Namespace, timeout: float = 10.0) -> Client:
    """The first daemon that answers (``--socket``, ``$MEMAGENT_SOCKET``, the system
    socket, the user's); none: one line naming every path tried, exit 2."""
    return connect(args.socket, timeout=timeout)


def cmd_attach(args: argparse.Namespace) -> int:
    problem = None if args.label is None else label_problem(args.label)
    if problem is not None:
        raise UsageError("memagent attach", f"--label: {problem}")
    if not args.pids and not (args.cgroup or args.unit or args.container):
        raise UsageError("memagent attach", "give PIDs, --cgroup, --unit or --container")
    with _connect(args) as c:
        reply = c.attach(args.pids, args.label, args.children, cgroup=args.cgroup, unit=args.unit,
                         container=args.container)
    return results(args.json, "attached", [process_json(p) for p in reply.attached],
                   [f"attached {p.pid} ({printable(p.label or p.name)})" for p in reply.attached], reply.failed)


def cmd_detach(args: argparse.Namespace) -> int:
    group = next(((k, v) for k in ("cgroup", "unit", "container") if (v := getattr(args, k)) is not None), None)
    if not args.pids and not args.exited and group is None:
        raise UsageError("memagent detach", "give PIDs, --exited, --cgroup, --unit or --container")
    with _connect(args) as c:
        reply = c.detach(args.pids, args.exited, **dict([group] if group else []))
    lines = [f"detached {r.pid}" for r in reply.detached]
    if group is not None:
        if not reply.rules_ended and not reply.detached:
            print(f"memagent detach: no rule of yours and no watched process for --{group[0]} "
                  f"{printable(group[1])}", file=sys.stderr)
            return EXIT_FAILED
        lines.append(f"ended {reply.rules_ended} --{group[0]} rule(s) for {printable(group[1])}")
    return results(args.json, "detached", [{"pid": r.pid, "start_time": r.start_time} for r in reply.detached],
                   lines, reply.failed)


def cmd_reset_peaks(args: argparse.Namespace) -> int:
    with _connect(args) as c:
        reply = c.reset_peaks(args.pids, kernel=args.kernel)
    return results(args.json, "reset", [process_json(p) for p in reply.reset],
                   [f"peak of {p.pid} reset to {human_bytes(p.rss_peak_bytes)}"
                    + ("" if p.rss_peak_exact else " (sampled until it passes the kernel's mark)")
                    for p in reply.reset], reply.failed)


def cmd_ls(args: argparse.Namespace) -> int:
    with _connect(args) as c:
        processes = c.list()
    if args.json:
        print_json([process_json(p) for p in processes])
    else:
        print(format_table(processes))
    return EXIT_OK


def health(status: DaemonStatus) -> int:
    """``memagent status``'s exit code: the most severe alert firing that this client sees."""
    severities = {a.severity for a in status.alerts_active}
    if Severity.CRITICAL in severities:
        return EXIT_CRITICAL
    if Severity.WARNING in severities:
        return EXIT_WARNING
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    with _connect(args) as c:
        status = c.status()
    if args.json:
        print_json(to_wire(status))
    else:
        print("\n".join(status_lines(status)))
    return health(status)


def cmd_stack(args: argparse.Namespace) -> int:
    with _connect(args, timeout=30.0) as c:
        reply = c.stack(args.pid, fresh=not args.cached)
    status = EXIT_OK if reply.state in (StackState.OK, StackState.EXITED) or reply.latest else EXIT_FAILED
    if args.json:
        print_json({k: v for k, v in to_wire(reply).items() if k != "id"})
        return status
    print("\n".join(stack_reply_lines(reply)))
    return status


def cmd_check_config(args: argparse.Namespace) -> int:
    from .. import config as config_file
    from ..errors import ConfigError

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
    "attach": cmd_attach,
    "detach": cmd_detach,
    "reset-peaks": cmd_reset_peaks,
    "ls": cmd_ls,
    "status": cmd_status,
    "stack": cmd_stack,
    "check-config": cmd_check_config,
    "demo": cmd_demo,
}


def add_parsers(sub: argparse._SubParsersAction[Parser], parents: Parents) -> None:
    client = parents.client
    a = sub.add_parser("attach", parents=client, help=help_of("attach"))
    a.add_argument("pids", nargs="*", type=_pid, metavar="PID")
    a.add_argument("--label", metavar="NAME")
    a.add_argument("--children", action="store_true", help="also descendants, now and later")
    group = a.add_mutually_exclusive_group()
    group.add_argument("--cgroup", metavar="PATH", help="also every process in this memory cgroup (as /proc/PID/cgroup "
                       "shows it) or below, now and later")
    group.add_argument("--unit", metavar="NAME", help="also every process of this systemd unit, now and later")
    group.add_argument("--container", metavar="NAME|ID", help="also every process of this container, now and later "
                       "(docs/containers.md)")

    dt = sub.add_parser("detach", parents=client, help=help_of("detach"))
    dt.add_argument("pids", nargs="*", type=_pid, metavar="PID")
    dt.add_argument("--exited", action="store_true", help="also every exited process")
    ends = dt.add_mutually_exclusive_group()
    for kind, metavar in (("cgroup", "PATH"), ("unit", "NAME"), ("container", "NAME|ID")):
        ends.add_argument(f"--{kind}", metavar=metavar, help=f"end the attach --{kind} rule (yours; any as root) "
                          "and stop watching its processes")

    r = sub.add_parser("reset-peaks", parents=client, help=help_of("reset-peaks"))
    r.add_argument("pids", nargs="+", type=_pid, metavar="PID")
    r.add_argument("--kernel", action="store_true",
                   help="also reset the kernel's high-water mark (exact at once; resets the process's own "
                        "ru_maxrss; only your own processes, never PID 1)")

    sub.add_parser("ls", parents=client, help=help_of("ls"))

    sk = sub.add_parser("stack", parents=client, help=help_of("stack"))
    sk.add_argument("pid", type=_pid, metavar="PID")
    sk.add_argument("--cached", action="store_true", help="do not take a fresh dump; show what the daemon has")

    sub.add_parser("status", parents=client, help=help_of("status"),
                   description="The daemon and the host: headroom, alerts, GPUs, the daemon's own health.",
                   epilog=STATUS_EPILOG)

    cc = sub.add_parser("check-config", help=help_of("check-config"))
    cc.add_argument("file", metavar="FILE")

    demo = sub.add_parser("demo", parents=parents.common, help=help_of("demo"))
    demo.add_argument("--seconds", type=seconds_arg, default=None, help="stop after this long")
