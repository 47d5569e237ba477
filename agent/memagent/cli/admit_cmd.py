"""``memagent admit --rss SIZE [--vram SIZE] [--gpu N] | --report FILE``: would a process
with these peaks fit on this box now, beside what the daemon watches? Nothing is run: the
pre-deployment check an operator makes before starting model N+1 (the judgement:
:mod:`memagent.gate.fits`; the report read back: :mod:`memagent.gate.outputs`).

Exit status: 0 it fits; 3 it does not; 1 the daemon cannot tell (a GPU it does not see) or
the report cannot be read; 2 no daemon, or a usage error. Both bounds are answered (Σ
peaks, the worst case; the highest total seen together, the observed); the status follows
the worst case unless ``--basis observed``. ``--json``: the verdict of each resource on
each bound (docs/cli.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..prose import human_bytes
from .args import Parents, Parser, UsageError, add_basis_argument, size_range_arg
from .exits import EXIT_FAILED, EXIT_OK, EXIT_OVER_BUDGET, CommandFailed, fail, print_json
from .table import help_of

PROG = "memagent admit"
#: A peak of 0 bytes asks nothing (and a process has some RSS): from a byte.
peak_arg = size_range_arg(1)


def add_parsers(sub: argparse._SubParsersAction[Parser], parents: Parents) -> None:
    p = sub.add_parser("admit", parents=parents.client, help=help_of("admit"),
                       description="Ask the daemon whether a process with these peaks would fit beside what it "
                                   "watches (Σ peaks within capacity, host and GPU); nothing is run.",
                       epilog="Exit status: 0 it fits, 3 it does not, 1 cannot tell or bad report, 2 no daemon or "
                              "usage error. Without --gpu, VRAM fits when it fits on one of the GPUs.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--rss", type=peak_arg, metavar="SIZE", help="its RSS peak (512MiB, 2G, bytes)")
    what.add_argument("--report", metavar="FILE", help="the peaks of a previous `memagent run --report FILE`")
    p.add_argument("--vram", type=peak_arg, metavar="SIZE", help="its GPU memory peak")
    p.add_argument("--gpu", metavar="N", help="the GPU it would use: index or UUID (default: any)")
    add_basis_argument(p)


def admit(args: argparse.Namespace) -> int:
    if args.gpu is not None and args.vram is None and args.report is None:
        raise UsageError(PROG, "--gpu needs --vram (or --report)")
    if args.report is not None and args.vram is not None:
        raise UsageError(PROG, "--vram goes with --rss, not --report (the report has its VRAM peak)")
    from ..client import connect  # the judge and the report reader: when the command runs
    from ..gate import OBSERVED, WORST_CASE
    from ..gate.fits import admission, bounds_json, decides, summary
    from ..gate.outputs import read_report

    rss, vram = read_report(args.report) if args.report is not None else (args.rss, args.vram)
    with connect(args.socket) as client:
        status = client.status()
    judged, chosen, gpu = admission(status, rss, vram, args.gpu)
    worst, observed = decides(chosen, WORST_CASE), decides(chosen, OBSERVED)
    fits = observed if args.basis == OBSERVED else worst
    if args.json:
        print_json({"fits": fits, "basis": args.basis, "rss_bytes": rss, "vram_bytes": vram, "gpu": gpu,
                    "resources": [v.to_json() for v in judged], **bounds_json(judged, chosen)})
    else:
        what = f"RSS {human_bytes(rss)}" + (f", VRAM {human_bytes(vram)}" if vram is not None else "")
        print(f"{what}: {'fits' if fits else 'does NOT fit'} (on the {args.basis} bound; worst case: "
              f"{'fits' if worst else 'does NOT fit'}, observed: {'fits' if observed else 'does NOT fit'})")
        for line in summary(chosen) + summary([v.observed() for v in chosen]):
            print(f"  {line}")
    return EXIT_OK if fits else EXIT_OVER_BUDGET


def cmd_admit(args: argparse.Namespace) -> int:
    try:
        return admit(args)
    except CommandFailed as exc:
        fail(args.json, f"{PROG}: {exc}", exc.code, str(exc))
        return EXIT_FAILED


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"admit": cmd_admit}
