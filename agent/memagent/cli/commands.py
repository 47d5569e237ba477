"""The client commands: each sends its requests through :class:`~.client.Client` and
prints text for people (:mod:`.render`) or, with ``--json``, the wire records
(:func:`memproto.schema.to_wire`). Errors are raised, and reported once by ``main``;
per-PID failures are reported here (:func:`.report.results`)."""

from __future__ import annotations

import argparse
import sys

from memproto.records import DaemonStatus
from memproto.schema import to_wire
from memproto.text import label_problem, printable
from memproto.vocabulary import Severity, StackState

from ..client import Client, connect
from ..prose import human_bytes
from .args import UsageError
from .exits import EXIT_CRITICAL, EXIT_FAILED, EXIT_OK, EXIT_WARNING, print_json, results
from .render import format_table, process_json, stack_reply_lines, status_lines

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


COMMANDS = {
    "attach": cmd_attach,
    "detach": cmd_detach,
    "reset-peaks": cmd_reset_peaks,
    "ls": cmd_ls,
    "status": cmd_status,
    "stack": cmd_stack,
}
