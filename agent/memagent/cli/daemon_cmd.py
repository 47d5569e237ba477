"""``memagent daemon``: the command that runs the agent in the foreground, with a flag
for each configuration key that declares one (:mod:`memagent.config.flags`).

Every flag's type is the check of the configuration key it sets (the same ranges as the
file), so a flag and a file key can never disagree on what is valid.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from memproto.paths import socket_path

from .. import config as config_file
from ..config import DEFAULT_PATH as DEFAULT_CONFIG
from ..config.flags import add_flags
from ..errors import ConfigError
from .args import Parents, Parser
from .exits import EXIT_NO_DAEMON
from .table import help_of


def add_parsers(sub: argparse._SubParsersAction[Parser], parents: Parents) -> None:
    """The ``daemon`` subcommand: ``--config``, every key's flag (declared with the key,
    memagent.config.sections), ``-v``."""
    d = sub.add_parser("daemon", parents=parents.common, help=help_of("daemon"))
    d.add_argument("--config", metavar="FILE", help=f"TOML configuration (default: {DEFAULT_CONFIG} if present)")
    add_flags(d)
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
