"""``memagent daemon``: its flags and the command that runs the agent in the foreground.

Every flag's type is the check of the configuration key it sets (the same ranges as the
file), so a flag and a file key can never disagree on what is valid.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from memproto.paths import socket_path
from memproto.text import printable

from .. import config as config_file
from ..config import DEFAULT_PATH as DEFAULT_CONFIG
from ..errors import ConfigError
from .exits import EXIT_NO_DAEMON


def _setting(key: str, one: bool = False) -> Callable[[str], object]:
    """The type of a daemon flag: its text through the check of the file's ``key`` (the
    same ranges), so ``--interval nan`` is "argument --interval: not a finite number: 'nan'";
    ``one``: the flag gives one item of a list key (a repeatable flag)."""

    def convert(text: str) -> object:
        try:
            return config_file.check_text(key, text)[0] if one else config_file.check_text(key, text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(printable(exc.reason)) from None

    convert.__name__ = key
    return convert


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """The ``daemon`` subcommand and its flags."""
    d = sub.add_parser("daemon", parents=parents, help="run the agent in the foreground")
    d.add_argument("--config", metavar="FILE", help=f"TOML configuration (default: {DEFAULT_CONFIG} if present)")
    d.add_argument("--interval", type=_setting("interval"), metavar="SECONDS", help="sample interval (0.5)")
    d.add_argument("--auto", action="append", metavar="PATTERN",
                   help="attach every process whose executable name matches (repeatable), e.g. 'python*'")
    d.add_argument("--auto-cmdline", action="append", type=_setting("auto_cmdline", one=True), metavar="PATTERN",
                   help="attach every process whose command line matches (repeatable): a glob, e.g. "
                        "'*serve.py*', or 're:REGEX' whose groups feed --auto-label (docs/containers.md)")
    d.add_argument("--auto-label", "--label", type=_setting("auto_label"), metavar="TEMPLATE",
                   help="label of auto-attached processes: text and {comm} {exe} {container} {unit} {pid} "
                        "{1} {NAME} (regex groups), e.g. '{container}'")
    d.add_argument("--admin-group", type=_setting("admin_group"), metavar="GROUP",
                   help="members see every process, as root does")
    d.add_argument("--socket-group", type=_setting("socket_group"), metavar="GROUP",
                   help="group of the socket file: its members may connect")
    d.add_argument("--state-dir", type=_setting("state_dir"), metavar="DIR",
                   help="keep the watched set and exited peaks here across restarts ('' : none; default: "
                        "/var/lib/memagent as root, $XDG_STATE_HOME/memagent otherwise, on the default socket)")
    d.add_argument("--history", type=_setting("history"), metavar="SECONDS", help="history kept (600)")
    d.add_argument("--status-refresh", type=_setting("status_refresh"), metavar="SECONDS",
                   help="longest time between two reads of an unchanged process's kernel peak and swap (1)")
    d.add_argument("--no-gpu", action="store_true", help="do not read GPU memory through NVML")
    d.add_argument("--no-netlink", action="store_true",
                   help="do not listen to the kernel's process events (fork, exec, exit records): poll /proc only")
    d.add_argument("--no-stacks", action="store_true", help="do not read Python stacks with py-spy")
    d.add_argument("--no-record", action="store_true",
                   help="no flight recorder (the sample stream and events kept on disk in the state directory)")
    d.add_argument("--py-spy", type=_setting("stacks.py_spy"), metavar="PATH",
                   help="py-spy executable (default: on PATH, then beside Python)")
    d.add_argument("--stack-budget", type=_setting("stacks.budget"), metavar="PER_SECOND",
                   help="py-spy dumps per second for the whole box (4)")
    d.add_argument("--stack-timeout", type=_setting("stacks.timeout"), metavar="SECONDS",
                   help="a py-spy dump taking longer is killed (2)")
    d.add_argument("--stack-sampler", type=_setting("stacks.sampler"), choices=("austin", "dumps", "off"),
                   help="what samples a growing process's stacks: austin (100 Hz, default), dumps (py-spy "
                        "dumps in a row: slows an allocating target ~10 %%), off (docs/stacks.md)")
    d.add_argument("--austin", type=_setting("stacks.austin"), metavar="PATH",
                   help="Austin executable (default: on PATH, then beside Python)")
    d.add_argument("--metrics", type=_setting("metrics.listen"), metavar="ADDR:PORT",
                   help="serve Prometheus metrics at http://ADDR:PORT/metrics, e.g. 127.0.0.1:9478 "
                        "([metrics] listen; docs/metrics.md)")
    d.add_argument("-v", "--verbose", action="store_true")


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
    try:
        config = config_file.agent_config(values, vars(args), socket)
    except ConfigError as exc:  # what no flag or key decides alone (an auto_label placeholder)
        print(f"memagent: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_NO_DAEMON
    return run_daemon(config)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"daemon": cmd_daemon}
