"""``memagent install-service`` and ``memagent completion``: their parsers and commands.

``install-service`` puts the daemon on this box as a systemd service, from the files inside
the package (``memagent/data``: the unit, the example configuration) and the files made
from the parser (:mod:`memagent.install.shellfiles`: completion, man page); what it does is
:mod:`memagent.install.installer`'s. The whole parser comes from ``main`` through the
parsers' defaults (``whole_parser``), so this module never imports ``main``. One line
per action on stdout; a second run says ``unchanged``.
``--uninstall`` removes what it wrote but the configuration and the group (``--purge``
removes those too); ``--dry-run`` writes nothing (and needs no root); ``--root DIR`` writes
every file under DIR, as DESTDIR does, the group only in DIR/etc/group (where there is
one), and leaves systemd alone. Not root, or anything that cannot be written: one line on
stderr, exit 1 (docs/cli.md, docs/service.md).

What they need is imported when they run.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from memproto.text import printable

from ..install import SHELLS
from .args import Parents, Parser, UsageError
from .exits import EXIT_FAILED, EXIT_OK, EXIT_STATUS_MAN
from .table import help_of

PROG = "memagent install-service"


def root_arg(value: str) -> str:
    if not value.startswith("/"):
        raise argparse.ArgumentTypeError(f"not an absolute path: {value!r}")
    return value


def cmd_install_service(args: argparse.Namespace) -> int:
    if args.purge and not args.uninstall:
        raise UsageError(PROG, "--purge goes with --uninstall", hint=True)
    if os.geteuid() != 0 and not args.dry_run:
        print(f"{PROG}: must be run as root (see what it would do with --dry-run)", file=sys.stderr)
        return EXIT_FAILED
    from ..install.installer import Installer, InstallFailed, install, uninstall
    from ..install.shellfiles import CommandLine

    box = Installer(args.root, args.dry_run, sys.stdout)
    try:
        if args.uninstall:
            uninstall(box, args.purge)
        else:
            install(box, CommandLine(args.whole_parser(), EXIT_STATUS_MAN))
    except InstallFailed as exc:
        sys.stdout.flush()
        print(printable(f"{PROG}: {exc}"), file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def cmd_completion(args: argparse.Namespace) -> int:
    from ..install.shellfiles import CompletionUnavailable, completion

    try:
        script = completion(args.whole_parser(), args.shell)
    except CompletionUnavailable as exc:
        print(f"memagent completion: {exc}", file=sys.stderr)
        return EXIT_FAILED
    sys.stdout.write(script)
    return EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "install-service": cmd_install_service,
    "completion": cmd_completion,
}


def add_parsers(sub: argparse._SubParsersAction[Parser], parents: Parents) -> None:
    """Register ``install-service`` and ``completion`` (:data:`COMMANDS`) on ``sub``;
    ``parents.whole`` makes the parser they write the completion and man page of."""
    i = sub.add_parser("install-service", help=help_of("install-service"),
                       description="Install the daemon as a systemd service: the unit (ExecStart= naming this "
                                   "memagent), the configuration if absent, the group memagent, bash and zsh "
                                   "completion, the man page and the docs; one line per action.",
                       epilog="docs/service.md. Exit 1: not root (without --dry-run), or something could not "
                              "be written.")
    i.add_argument("--uninstall", action="store_true",
                   help="remove what it installed (not the configuration nor the group)")
    i.add_argument("--purge", action="store_true", help="with --uninstall: also the configuration and the group")
    i.add_argument("--dry-run", action="store_true", help="say what it would do; change nothing (no root needed)")
    i.add_argument("--root", type=root_arg, metavar="DIR",
                   help="write every file under DIR (as DESTDIR); the group only in DIR/etc/group, if any; "
                        "systemd is left alone")
    c = sub.add_parser("completion", help=help_of("completion"),
                       description="Print the completion script: source <(memagent completion bash).")
    c.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash or zsh")
    for p in (i, c):
        p.set_defaults(whole_parser=parents.whole)
