"""The agent's configuration from its three sources: the keys' defaults, the file, then
the daemon's flags (which win), each key merged by its one declaration.

A SIGHUP makes it again the same way (:class:`ConfigSource`): the same file, read again,
under the same flags.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from memproto.paths import socket_path, user_socket

from .auto import check_names
from .file import default_path, load
from .keys import Key, keys_of
from .sections import AgentConfig

#: Root's state directory: the unit's ``StateDirectory=memagent``.
SYSTEM_STATE_DIR = "/var/lib/memagent"

#: A key neither the file nor a flag gives.
_NOT_GIVEN = object()


def default_state_dir(socket: str, environ: dict[str, str] | None = None) -> str | None:
    """The state directory of a daemon given none: root's :data:`SYSTEM_STATE_DIR`, another
    user's ``$XDG_STATE_HOME/memagent`` (``~/.local/state/memagent``), but only for a daemon
    on its default socket: a second daemon on another socket (a test, a private one) must
    neither restore nor overwrite the first one's state, so it keeps none unless told."""
    env = os.environ if environ is None else environ
    if socket != user_socket(env):
        return None
    if os.geteuid() == 0:
        return SYSTEM_STATE_DIR
    base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "memagent")


def given(k: Key, values: dict[str, Any], flags: dict[str, Any]) -> Any:
    """The value of key ``k`` from its flag (given: not None, or set for a ``--no-...``
    switch), else from the file's checked ``values``; :data:`_NOT_GIVEN` if neither."""
    f = k.flag
    if f is not None and f.switch_off and flags.get(f.dest):
        return False
    if f is not None and not f.switch_off and flags.get(f.dest) is not None:
        return flags[f.dest]
    return values.get(k.file, _NOT_GIVEN)


def agent_config(values: dict[str, Any], flags: dict[str, Any], socket: str,
                 cls: type[AgentConfig] = AgentConfig) -> AgentConfig:
    """An :class:`AgentConfig` (or ``cls``) from file ``values`` and command-line ``flags``
    (argparse's names; None: not given); flags win, what neither gives keeps its default.
    ConfigError: see :func:`memagent.config.auto.check_names`."""
    config = cls(socket=socket)
    set_here: set[str] = set()
    for row in keys_of(cls):
        if row.key.file == "socket":  # resolved by the caller (memproto.paths.socket_path)
            continue
        value = given(row.key, values, flags)
        if value is not _NOT_GIVEN:
            row.set(config, value)
            set_here.add(row.key.file)
    if "state_dir" not in set_here:
        config.state_dir = default_state_dir(socket)
    config.state_dir = config.state_dir or None  # "": off
    config.source = ConfigSource(dict(flags))
    check_names(config.auto_cmdline, config.auto_label)  # the file's and the flags' together
    return config


@dataclass(frozen=True)
class ConfigSource:
    """How the daemon's configuration was made, so that SIGHUP makes it again the same
    way: the file (``--config``, else the default path when present, as at start) under
    the same command-line ``flags``, which still win over the file."""

    flags: dict[str, Any]

    @property
    def path(self) -> str | None:
        return self.flags.get("config") or default_path()

    def load(self) -> AgentConfig:
        """The configuration as a restart would build it now; ConfigError (one line, as
        ``check-config`` says it) when the file is not valid."""
        path = self.path
        values = load(path) if path else {}
        return agent_config(values, self.flags, socket_path(self.flags.get("socket") or values.get("socket")))
