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
import time
from collections.abc import Sequence
from typing import Any

from memproto import ProtocolError
from memproto.records import Failure, ProcessInfo, StackDump
from memproto.schema import to_wire

from . import __version__
from . import config as config_file
from .client import Client, ConnectionLost, DaemonNotRunning, RequestFailed
from .config import DEFAULT_PATH as DEFAULT_CONFIG
from .paths import socket_path
from .units import human_bytes

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_NO_DAEMON = 2


def _pid(value: str) -> int:
    try:
        pid = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a PID: {value!r}") from None
    if pid <= 0:
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


def process_json(p: ProcessInfo) -> dict[str, Any]:
    return to_wire(p)  # type: ignore[no-any-return]


def _print_json(value: object) -> None:
    json.dump(value, sys.stdout, indent=None)
    sys.stdout.write("\n")


def _report_failures(failed: list[Failure]) -> int:
    for f in failed:
        print(f.message if f.code in ("no_such_process", "permission_denied") else f"{f.code}: {f.message}",
              file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


def format_table(processes: list[ProcessInfo]) -> str:
    gpu = any(p.vram_bytes is not None or p.vram_peak_bytes is not None or p.gpus for p in processes)
    vram_title = f" {'VRAM':>10} {'VPEAK':>10}" if gpu else ""
    header = (f"{'PID':>7}  {'NAME':<20} {'RSS':>10} {'PEAK':>10} {'ANON':>10} {'SWAP':>9}{vram_title}  "
              f"{'STATE':<6} COMMAND")
    lines = [header]
    for p in sorted(processes, key=lambda p: p.rss_peak_bytes, reverse=True):
        name = p.label or p.name
        state = "alive" if p.alive else "exited"
        peak = human_bytes(p.rss_peak_bytes) + ("" if p.rss_peak_exact else "~")
        cmd = " ".join(p.cmdline)[:60]
        vram = ""
        if gpu:
            vpeak = human_bytes(p.vram_peak_bytes) + ("" if p.vram_peak_exact or p.vram_peak_bytes is None else "~")
            vram = f" {human_bytes(p.vram_bytes):>10} {vpeak:>10}"
        lines.append(
            f"{p.pid:>7}  {name[:20]:<20} {human_bytes(p.rss_bytes):>10} {peak:>10} "
            f"{human_bytes(p.anon_bytes):>10} {human_bytes(p.swap_bytes):>9}{vram}  {state:<6} {cmd}"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- commands


def _connect(args: argparse.Namespace) -> Client:
    return Client(socket_path(args.socket))


def cmd_attach(args: argparse.Namespace) -> int:
    with _connect(args) as c:
        reply = c.attach(args.pids, args.label, args.children)
    if args.json:
        _print_json([process_json(p) for p in reply.attached])
    else:
        for p in reply.attached:
            print(f"attached {p.pid} ({p.label or p.name})")
    return _report_failures(reply.failed)


def cmd_detach(args: argparse.Namespace) -> int:
    if not args.pids and not args.exited:
        print("memagent detach: give PIDs or --exited", file=sys.stderr)
        return EXIT_NO_DAEMON
    with _connect(args) as c:
        reply = c.detach(args.pids, args.exited)
    if args.json:
        _print_json([{"pid": r.pid, "start_time": r.start_time} for r in reply.detached])
    else:
        for r in reply.detached:
            print(f"detached {r.pid}")
    return _report_failures(reply.failed)


def cmd_reset_peaks(args: argparse.Namespace) -> int:
    with _connect(args) as c:
        reply = c.reset_peaks(args.pids)
    if args.json:
        _print_json([process_json(p) for p in reply.reset])
    else:
        for p in reply.reset:
            print(f"peak of {p.pid} reset to {human_bytes(p.rss_peak_bytes)}")
    return _report_failures(reply.failed)


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
    t = status.tick
    print(f"{status.software}, pid {status.pid}, uid {status.uid}, socket {status.socket}")
    print(f"watching {status.watched} processes ({status.alive} alive), {status.clients} clients")
    print(f"interval {status.interval:g} s: {t.ticks} ticks, mean {t.mean_interval * 1000:.1f} ms, "
          f"max lateness {t.max_lateness * 1000:.1f} ms, {t.overruns} overruns, "
          f"last tick took {t.last_duration * 1000:.2f} ms")
    h = status.host
    print(f"host memory: {human_bytes(h.total_bytes - h.available_bytes)} used of {human_bytes(h.total_bytes)}, "
          f"swap {human_bytes(h.swap_total_bytes - h.swap_free_bytes)} of {human_bytes(h.swap_total_bytes)}")
    if not status.gpu_available:
        print(f"GPU memory: not available ({status.gpu_note or 'unknown reason'})")
    for g in status.gpus:
        state = "LOST" if g.lost else f"{human_bytes(g.used_bytes)} used of {human_bytes(g.total_bytes)}"
        print(f"GPU {g.index}: {g.name} {g.uuid}: {state}")
    for hr in status.headroom:
        ratio = f"{hr.ratio:.0%}" if hr.ratio is not None else "n/a"
        print(f"headroom {hr.name}: Σ peaks {human_bytes(hr.sum_peaks_bytes)} of {human_bytes(hr.capacity_bytes)} "
              f"({ratio})" + (" [configured]" if hr.configured else ""))
    if status.pressure is not None:
        print(f"memory pressure (PSI some avg10): {status.pressure:.1f}%")
    for a in status.alerts_active:
        print(f"ALERT {a.severity} {a.kind} [{a.resource}]: {a.message}")
    if not status.host_pid_namespace:
        print("warning: the daemon is in a nested PID namespace; NVML's host PIDs will not match "
              "(run it in the host PID namespace)")
    return EXIT_OK


def format_stack(dump: StackDump, title: str) -> list[str]:
    when = time.strftime("%H:%M:%S", time.localtime(dump.time))
    lines = [f"{title} (taken {when} on {dump.trigger}, RSS {human_bytes(dump.rss_bytes)}"
             + (f", VRAM {human_bytes(dump.vram_bytes)})" if dump.vram_bytes is not None else ")")]
    for t in dump.threads:
        mark = "*" if t.thread_id == dump.attributed_thread else " "
        state = "active" if t.active else "idle"
        lines.append(f" {mark} thread {t.name or t.thread_id} ({state}{', holds the GIL' if t.owns_gil else ''})")
        lines.extend(f"      {f.name} ({f.filename}:{f.line})" for f in t.frames)
    return lines


def cmd_stack(args: argparse.Namespace) -> int:
    with Client(socket_path(args.socket), timeout=30.0) as c:
        reply = c.stack(args.pid, fresh=not args.cached)
    status = EXIT_OK if reply.state in ("ok", "exited") or reply.latest else EXIT_FAILED
    if args.json:
        _print_json({k: v for k, v in to_wire(reply).items() if k != "id"})
        return status
    print(f"{reply.pid}: stack state {reply.state}" + (f": {reply.message}" if reply.message else ""))
    if reply.latest:
        print("\n".join(format_stack(reply.latest, "latest stack")))
    if reply.at_peak and reply.at_peak != reply.latest:
        print("\n".join(format_stack(reply.at_peak, "stack at peak")))
    if reply.by_line:
        print("where memory grew (attributed to the next stack taken; correlation, not proof):")
        for s in reply.by_line[:10]:
            print(f"  {human_bytes(s.bytes):>10}  {s.samples:>4}x  {s.function} ({s.filename}:{s.line})")
    return status


def cmd_daemon(args: argparse.Namespace) -> int:
    from .slim import skip_tls_import

    skip_tls_import()
    from .daemon import run_daemon, setup_logging

    setup_logging(args.verbose)
    path = args.config or config_file.default_path()
    try:
        values = config_file.load(path) if path else {}
    except config_file.ConfigError as exc:
        print(f"memagent: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_NO_DAEMON
    socket = socket_path(args.socket or values.get("socket"))
    return run_daemon(config_file.agent_config(values, vars(args), socket))


def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        values = config_file.load(args.file)
    except config_file.ConfigError as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{args.file}: valid ({len(values)} keys set)")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo_printing

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

