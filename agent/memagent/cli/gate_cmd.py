"""``memagent run [--budget-rss SIZE] [--budget-vram SIZE] [--per-process] ... -- CMD ARGS…``:
the command line of the gate (run CMD under an embedded agent, judge its tree's peaks
against a budget, exit with CMD's status or 3). What it does: :mod:`memagent.gate.run`;
here only its parser, the check that there is a CMD, and the one line and exit status of
each error. (Not ``run_cmd.py``: the gate's loop moved from that name, so a merge follows it.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from memproto.client_side import ClientError, ConnectionLost, DaemonNotRunning
from memproto.text import printable

from ..errors import MemagentError
from .args import Parents, Parser, UsageError, add_basis_argument, config_range_arg, int_range_arg, size_range_arg
from .exits import EXIT_NO_DAEMON, EXIT_OVER_BUDGET, CommandFailed
from .table import help_of

PROG = "memagent run"

EPILOG = ("Exit status: CMD's own when within budget; 3 when over (--over-budget-status N); 126/127 when CMD "
          "cannot be executed / is not found; 128+n when CMD died of signal n; 2 on a usage error or (--fits) no "
          "daemon; 1 when --report/--junit cannot be written. The budget applies to the sum of the tree's "
          "share-adjusted peaks (--per-process: to each process); --fits fails (3) when the tree's peaks added to "
          "what the daemon watches exceed the box's capacity. SIZE: 512MiB, 2G, 1.5GiB, 2Gi, bytes.")


status_arg = int_range_arg(0, 255, "an exit status", say_range=True)
#: A budget of 0 bytes is over before CMD starts: refused, as any size below a byte.
budget_arg = size_range_arg(1)
#: The daemon's own range (0.01 to 60 s): below it the sampler would spin a core.
interval_arg = config_range_arg("interval", "a sample interval")


def add_parsers(sub: argparse._SubParsersAction[Parser], parents: Parents) -> None:
    p = sub.add_parser("run", parents=parents.common, help=help_of("run"),
                       description="Run CMD watched with all its descendants by an embedded agent; print "
                                   "the peaks on exit and fail when over budget.", epilog=EPILOG)
    p.add_argument("--budget-rss", type=budget_arg, metavar="SIZE", help="budget for the Σ of RSS peaks")
    p.add_argument("--budget-vram", type=budget_arg, metavar="SIZE", help="budget for the Σ of VRAM peaks")
    p.add_argument("--per-process", action="store_true", help="apply the budgets to each process instead")
    p.add_argument("--fits", action="store_true",
                   help="also fail when its peaks would not fit beside what the running daemon watches")
    add_basis_argument(p)
    p.add_argument("--interval", type=interval_arg, default=0.1, metavar="SECONDS",
                   help="sample interval, 0.01 to 60 (0.1)")
    p.add_argument("--report", metavar="FILE", help="write the summary as JSON")
    p.add_argument("--record", metavar="FILE", help="write a recording (docs/recording.md)")
    p.add_argument("--junit", metavar="FILE", help="write a JUnit XML test case (failed when over budget)")
    p.add_argument("--over-budget-status", type=status_arg, default=EXIT_OVER_BUDGET, metavar="N",
                   help="exit status when over budget (3)")
    p.add_argument("--kill-over-budget", action="store_true", help="kill CMD and its descendants once over budget")
    p.add_argument("--progress", action="store_true", help="one line a second on stderr while CMD runs")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD ARGS")


def cmd_run(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise UsageError(PROG, "no command to run (memagent run [OPTIONS] -- CMD ARGS…)", hint=True)
    from ..gate.run import run_command  # the gate (its agent only once CMD is to run): only for this command

    try:
        return run_command(argv, args)
    except DaemonNotRunning as exc:  # --fits: checked before CMD runs
        print(f"{PROG}: --fits: {printable(str(exc))}", file=sys.stderr)
        return EXIT_NO_DAEMON
    except ConnectionLost as exc:
        print(f"{PROG}: the embedded agent went away: {exc}", file=sys.stderr)
        return 1
    except CommandFailed as exc:  # --record's, or a --report/--junit path refused before CMD runs
        print(f"{PROG}: {printable(str(exc))}", file=sys.stderr)
        return exc.status
    except (ClientError, MemagentError) as exc:  # after CommandFailed, one of them with its own status
        print(f"{PROG}: {printable(str(exc))}", file=sys.stderr)
        return 1


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"run": cmd_run}
