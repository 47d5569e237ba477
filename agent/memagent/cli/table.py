"""Every ``memagent`` command, declared once: its name, the module of ``memagent.cli`` that
adds its parser and runs it, and its one line of help.

``main`` builds the parser of the command asked for alone, and a one-line stub of every
other (for ``memagent --help`` and argparse's list of choices): ``memagent ls`` imports what
``ls`` uses and nothing of ``run``, ``plot`` or the daemon's flags (issue 26: every command
was imported for each call, 5.3x the CPU of ``import psutil``). A command module has
``add_parsers(sub, parents)``, which adds each of its commands (with the help given here),
and ``COMMANDS``, name to the function that runs it.

This module imports nothing, so that a command module can read its help from here.
"""

from __future__ import annotations

from typing import Final, NamedTuple


class Command(NamedTuple):
    module: str
    help: str


#: In the order ``memagent --help`` lists them. A module's commands stand together.
TABLE: Final[dict[str, Command]] = {
    "daemon": Command("daemon_cmd", "run the agent in the foreground"),
    "attach": Command("commands", "start watching processes"),
    "detach": Command("commands", "stop watching processes"),
    "reset-peaks": Command("commands", "start a new peak window"),
    "ls": Command("commands", "list watched processes"),
    "stack": Command("commands", "Python stacks of a watched process, and where it grew"),
    "status": Command("commands", "the daemon and the host (exit 4/5: an alert is firing)"),
    "check-config": Command("commands", "validate a configuration file"),
    "demo": Command("commands", "run a demo fleet under an agent, print ls each second"),
    "history": Command("history_cmd", "memory of processes over time (RAM or recording)"),
    "record": Command("record_cmd", "record the daemon's samples and events to a file"),
    "report": Command("report_cmd", "the peaks, Σ peaks, alerts and OOM kills of a recording"),
    "plot": Command("plot_cmd", "draw a recording: memory per process over time"),
    "run": Command("gate_cmd", "run a command under a memory budget (no daemon needed)"),
    "admit": Command("admit_cmd", "would a process with these peaks fit here now?"),
    "install-service": Command("install_cmd", "install the systemd unit, configuration, completion, man page (root)"),
    "completion": Command("install_cmd", "print the bash or zsh completion script"),
}


def help_of(name: str) -> str:
    return TABLE[name].help
