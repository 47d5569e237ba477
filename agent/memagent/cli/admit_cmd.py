"""``memagent admit --rss SIZE [--vram SIZE] [--gpu N] | --report FILE``: would a process
with these peaks fit on this box now, beside what the daemon watches? Nothing is run: the
pre-deployment check an operator makes before starting model N+1 (the judgement:
:mod:`.fits`).

Exit status: 0 it fits; 3 it does not; 1 the daemon cannot tell (a GPU it does not see) or
the report cannot be read; 2 no daemon, or a usage error. ``--json``: the verdict of each
resource (docs/cli.md).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any, TypeGuard

from memproto.text import printable

from ..client import connect
from ..gate.fits import HOST, FitVerdict, Need, best_gpu, gpu_uuid, judge, summary
from ..prose import human_bytes
from .args import Parser, UsageError, size_arg
from .exits import EXIT_FAILED, EXIT_OK, EXIT_OVER_BUDGET, CommandFailed, fail, print_json

PROG = "memagent admit"
#: A run report is a few KiB; anything this big is not one.
MAX_REPORT = 16 << 20
BAD_REPORT = "bad-report"
CANNOT_TELL = "cannot-tell"


def add_parser(sub: argparse._SubParsersAction[Parser], parents: list[Parser]) -> None:
    p = sub.add_parser("admit", parents=parents, help="would a process with these peaks fit here now?",
                       description="Ask the daemon whether a process with these peaks would fit beside what it "
                                   "watches (Σ peaks within capacity, host and GPU); nothing is run.",
                       epilog="Exit status: 0 it fits, 3 it does not, 1 cannot tell or bad report, 2 no daemon or "
                              "usage error. Without --gpu, VRAM fits when it fits on one of the GPUs.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--rss", type=size_arg, metavar="SIZE", help="its RSS peak (512MiB, 2G, bytes)")
    what.add_argument("--report", metavar="FILE", help="the peaks of a previous `memagent run --report FILE`")
    p.add_argument("--vram", type=size_arg, metavar="SIZE", help="its GPU memory peak")
    p.add_argument("--gpu", metavar="N", help="the GPU it would use: index or UUID (default: any)")


def read_report(path: str) -> tuple[int, int | None]:
    """The RSS and VRAM peaks of a ``memagent run --report`` file."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_REPORT + 1)
    except OSError as exc:
        raise CommandFailed(BAD_REPORT, f"cannot read {printable(path)}: {exc.strerror or exc}") from None
    try:
        report: Any = json.loads(data) if len(data) <= MAX_REPORT else None
    except (ValueError, RecursionError):
        report = None
    rss = report.get("rss_peak_bytes") if isinstance(report, dict) else None
    vram = report.get("vram_peak_bytes") if isinstance(report, dict) else None
    if not _size(rss) or not (vram is None or _size(vram)):
        raise CommandFailed(BAD_REPORT, f"{printable(path)}: not a memagent run report (no rss_peak_bytes)")
    return rss, vram


def _size(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62


def verdicts(args: argparse.Namespace, rss: int, vram: int | None) -> tuple[list[FitVerdict], str | None]:
    """Host, and the GPU (the one asked for, else the roomiest); the GPU chosen."""
    with connect(args.socket) as client:
        status = client.status()
    host = judge([Need(HOST, rss)], status.headroom)
    if vram is None:
        return host, None
    if args.gpu is not None:
        uuid = gpu_uuid(status, args.gpu)
        if uuid is None:
            seen = ", ".join(f"{g.index} {g.uuid}" for g in status.gpus) or "none"
            raise CommandFailed(CANNOT_TELL, f"the daemon sees no GPU {printable(args.gpu)} (it sees: {seen})")
        return host + judge([Need(uuid, vram)], status.headroom), uuid
    gpus = best_gpu(vram, status)
    if not gpus:
        raise CommandFailed(CANNOT_TELL, "the daemon sees no GPU: cannot judge --vram"
                            + (f" ({printable(status.gpu_note)})" if status.gpu_note else ""))
    return host + gpus, gpus[0].resource


def admit(args: argparse.Namespace) -> int:
    if args.gpu is not None and args.vram is None and args.report is None:
        raise UsageError(PROG, "--gpu needs --vram (or --report)")
    if args.report is not None and args.vram is not None:
        raise UsageError(PROG, "--vram goes with --rss, not --report (the report has its VRAM peak)")
    rss, vram = read_report(args.report) if args.report is not None else (args.rss, args.vram)
    judged, gpu = verdicts(args, rss, vram)
    unknown = [v for v in judged if v.capacity_bytes is None]
    if unknown:
        raise CommandFailed(CANNOT_TELL, unknown[0].line())
    chosen = [v for v in judged if v.resource in (HOST, gpu)]
    fits = all(v.fits for v in chosen)
    if args.json:
        print_json({"fits": fits, "rss_bytes": rss, "vram_bytes": vram, "gpu": gpu,
                    "resources": [v.to_json() for v in judged]})
    else:
        what = f"RSS {human_bytes(rss)}" + (f", VRAM {human_bytes(vram)}" if vram is not None else "")
        print(f"{what}: {'fits' if fits else 'does NOT fit'}")
        for line in summary(chosen):
            print(f"  {line}")
    return EXIT_OK if fits else EXIT_OVER_BUDGET


def cmd_admit(args: argparse.Namespace) -> int:
    try:
        return admit(args)
    except CommandFailed as exc:
        fail(args.json, f"{PROG}: {exc}", exc.code, str(exc))
        return EXIT_FAILED


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"admit": cmd_admit}
