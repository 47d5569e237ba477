"""The daemon's TOML configuration: defaults, file, then command-line flags.

``--config FILE``, else ``/etc/memagent/memagent.toml`` when present. Every key is listed
in ``docs/configuration.md`` and ``packaging/memagent.toml``; an unknown key or a wrong
value is an error naming the key and its line, so a typo never silently keeps a default.
Every key's check and range: :mod:`memagent.config_schema` (the flags go through the same
checks). Sizes take ``512MiB``, ``2G``, ``1.5GiB`` or a number of bytes (K/M/G/T and
KiB/MiB/GiB/TiB are binary; KB/MB/GB/TB are decimal); without a unit, 0 or at least 1 MiB.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from memproto.paths import socket_path, user_socket
from memproto.text import printable

from .config_auto import AutoAttachConfig, check_names
from .config_metrics import MetricsConfig, metrics_config
from .config_schema import (
    MAX_SIZE,
    RESERVED_FOR_ADMINS,
    SCHEMA,
    Check,
    MiB,
    Refused,
    Where,
    check_all,
    check_of,
    check_text,
    lookup_user,
    parse_size,
)
from .errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "DEFAULT_PATH", "MAX_FILE", "MAX_SIZE", "RESERVED_FOR_ADMINS", "RESTART_KEYS", "SCHEMA", "AgentConfig",
    "AlertConfig", "Check", "ConfigError", "ConfigSource", "HeadroomConfig", "MetricsConfig", "MiB", "RecordConfig",
    "StackConfig", "agent_config", "changed_keys", "check_of", "check_text", "default_path", "key_line", "load",
    "lookup_user", "parse_size", "validate",
]

DEFAULT_PATH = "/etc/memagent/memagent.toml"
#: A configuration file is read up to this size: a bigger one is refused (not a config).
MAX_FILE = MiB


@dataclass
class HeadroomConfig:
    #: Memory the watched processes may use altogether; None: derived (see docs/headroom.md).
    host_capacity: int | None = None
    #: Kept free for everything else (used only when capacity is derived).
    host_reserve: int = 256 * MiB
    gpu_reserve: int = 256 * MiB
    #: Seconds between two PSS reads of a process (smaps_rollup holds its mmap lock).
    pss_refresh: float = 30.0
    #: Re-read the PSS of sharing processes when the host's used memory drifts this far
    #: from what the watched processes are thought to use (see docs/headroom.md).
    pss_drift: int = 64 * MiB


@dataclass
class AlertConfig:
    warn_fraction: float = 0.9
    critical_fraction: float = 1.0
    #: A firing alert resolves only below threshold * (1 - hysteresis).
    hysteresis: float = 0.05
    hook: list[str] = field(default_factory=list)
    hook_timeout: float = 5.0
    #: Whom the hook runs as when the daemon is root (a user name or a numeric UID).
    hook_user: str = "nobody"
    #: Per alert key (kind, resource): at most one hook run per this many seconds; a newer
    #: alert of the key waits, the latest one per key (see :mod:`memagent.alerting.hooks`).
    hook_min_interval: float = 10.0
    #: For the whole daemon: hook runs per second, and how many at once after a lull.
    hook_rate: float = 1.0
    hook_burst: int = 5
    #: Memory PSI ``some avg10`` (percent of time stalled) that fires a pressure alert.
    pressure_threshold: float = 10.0
    #: Leak: sustained growth of at least ``leak_min_rate`` bytes a minute, with the headroom
    #: gone within ``leak_horizon`` seconds at that pace; it must have lasted 1% of that
    #: time, 20 s to ``leak_window`` seconds (see memagent.alerting.growth).
    leak_window: float = 300.0
    leak_min_rate: int = 1 * MiB
    leak_horizon: float = 86400.0
    #: Per-label budgets (Σ of the peaks of the processes with that label), bytes.
    budgets: dict[str, int] = field(default_factory=dict)
    #: How many ended alerts ``status`` keeps.
    recent: int = 100


@dataclass
class StackConfig:
    """When and how Python stacks are read (see :mod:`memagent.core.stack_collector`)."""

    enabled: bool = True
    #: Dumps per second for the whole box, and how many may be taken at once after a lull.
    budget: float = 4.0
    burst: int = 4
    #: py-spy processes running at the same time, at most.
    concurrency: int = 2
    timeout: float = 2.0
    #: Growth between two ticks (RSS + VRAM) that triggers a dump.
    growth_threshold: int = 32 * MiB
    #: Every watched Python process gets a stack at least this often.
    rotation: float = 30.0
    #: py-spy executable; None: look on PATH, then beside this Python.
    py_spy: str | None = None
    #: What samples a growing process: "austin" (100 Hz), "dumps" (py-spy, costly) or "off".
    sampler: str = "austin"
    austin: str | None = None


@dataclass
class RecordConfig:
    """The flight recorder (memagent.store.recorder, docs/recording.md)."""

    enabled: bool = True
    #: The recorder's segments together, at most (the oldest go first).
    max_bytes: int = 256 * MiB
    #: A segment's size before the next begins; None: max_bytes / 16, from 256 KiB to 16 MiB.
    segment_bytes: int | None = None
    #: Seconds between two tries to write again after a full disk.
    retry_interval: float = 10.0

    @property
    def segment_size(self) -> int:
        return self.segment_bytes or min(16 * MiB, max(MiB // 4, self.max_bytes // 16))


@dataclass
class AgentConfig(AutoAttachConfig):
    """Everything an agent (daemon, embedded or demo) is built from (auto-attach: its base)."""

    socket: str
    interval: float = 0.5
    #: Members of this group see and change every watched process, as root does.
    admin_group: str | None = None
    #: The socket file's group: its members may connect.
    socket_group: str | None = None
    history_seconds: float = 600.0
    history_step: float = 1.0
    #: Longest time between two reads of a process's VmHWM and swap (when statm is unchanged).
    status_refresh: float = 1.0
    scan_interval: float = 1.0
    max_exited: int = 256
    #: Connections at once; the last 8 are kept for root and admin-group clients.
    max_clients: int = 64
    #: Connections one non-admin UID may hold at once.
    max_clients_per_uid: int = 8
    #: A client neither subscribed nor sending requests for this long is closed (seconds).
    client_idle_timeout: float = 60.0
    #: Read GPU memory through NVML (when a driver is there).
    gpu: bool = True
    #: Hear process events from the kernel over netlink (fork, exec, exit records) where
    #: the daemon may; false: poll /proc only (see memagent.core.process_events).
    netlink: bool = True
    #: Where the container engines' files are (``/`` on a box; "": names off): docs/containers.md.
    containers_root: str = "/"
    #: Jetson's nvmap clients file (None: memagent.proc.nvmap's default; "": not read): docs/gpu.md.
    nvmap_clients: str | None = None
    stacks: StackConfig = field(default_factory=StackConfig)
    headroom: HeadroomConfig = field(default_factory=HeadroomConfig)
    alerts: AlertConfig = field(default_factory=AlertConfig)
    record: RecordConfig = field(default_factory=RecordConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    #: Where the watched set and the peaks of exited processes are kept across restarts
    #: (memagent.store.state); None: nowhere (embedded, demo, or ``state_dir = ""``).
    state_dir: str | None = None
    #: Where the daemon's configuration came from, to read it again on SIGHUP (set by
    #: :func:`agent_config`; None for an agent built otherwise: embedded, demo, tests).
    source: ConfigSource | None = field(default=None, compare=False, repr=False)


# ----------------------------------------------------------------------------- the file


def validate(data: dict[str, Any], path: str | None = None, text: str | None = None) -> dict[str, Any]:
    """The checked values (see :mod:`memagent.config_schema`), flattened to ``section.key``;
    raises ConfigError naming the key, and ``path:LINE`` when the file's ``text`` is given."""
    try:
        return check_all(data)
    except Refused as refused:
        line = None if text is None or path is None else key_line(text, refused.where)
        where = None if path is None else printable(path) if line is None else f"{printable(path)}:{line}"
        raise ConfigError(printable(refused.key), refused.reason, where) from None


# ----------------------------------------------------------------------------- lines


def _holds(text: str, where: Where) -> bool | None:
    """Whether ``text`` (as TOML) sets the key at ``where``; None: it does not parse."""
    try:
        node: object = tomllib.loads(text)
    except (ValueError, RecursionError):  # tomllib.TOMLDecodeError is a ValueError
        return None
    for name in where:
        if not isinstance(node, dict) or name not in node:
            return False
        node = node[name]
    return True


def key_line(text: str, where: Where) -> int | None:
    """The line (from 1) where the valid TOML ``text`` sets the key at ``where``: the first
    line of its statement (``key = [`` of an array over several lines, the ``[table]``
    header of a table). tomllib gives no positions, so prefixes of the text are parsed: the
    smallest whole-statement prefix that sets the key ends on the statement's last line, and
    the statement starts after the longest prefix before it that parses. None if no prefix
    sets it (a key the file does not hold)."""
    lines = re.findall(r"[^\n]*\n|[^\n]+$", text)  # TOML ends lines at \n only

    def holds(n: int) -> bool | None:
        return _holds("".join(lines[:n]), where)

    if holds(len(lines)) is not True:
        return None
    lo, hi = 0, len(lines)  # no prefix of lo lines or fewer sets the key; that of hi lines does
    while hi - lo > 1:
        mid = (lo + hi) // 2
        probe, state = mid, holds(mid)
        while state is None and probe - 1 > lo:  # inside a statement: the one before it
            probe -= 1
            state = holds(probe)
        if state:
            hi = probe
        else:
            lo = mid
    start = hi - 1  # the longest prefix before the statement that parses
    while start > 0 and holds(start) is None:
        start -= 1
    return start + 1


def load(path: str) -> dict[str, Any]:
    """Read and validate a config file; every failure is one ConfigError (one line)."""
    shown = printable(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE + 1)
    except OSError as exc:
        raise ConfigError("-", f"cannot read: {printable(exc.strerror or str(exc))}", shown) from None
    if len(raw) > MAX_FILE:
        raise ConfigError("-", f"larger than {MAX_FILE // MiB} MiB: not a configuration file", shown)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError("-", f"not UTF-8 text: byte 0x{raw[exc.start]:02x}", f"{shown}:{line}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        at = re.search(r"\(at line (\d+), column \d+\)$", str(exc))
        raise ConfigError("-", f"not valid TOML: {exc}", f"{shown}:{at.group(1)}" if at else shown) from None
    except RecursionError:
        raise ConfigError("-", "not valid TOML: nested too deeply", shown) from None
    except ValueError:  # int() of a number past sys.get_int_max_str_digits()
        long = re.search(r"[0-9_]{4000,}", text)
        where = shown if long is None else f"{shown}:{text.count(chr(10), 0, long.start()) + 1}"
        raise ConfigError("-", "not valid TOML: a number too long", where) from None
    return validate(data, path, text)


def default_path() -> str | None:
    return DEFAULT_PATH if os.path.exists(DEFAULT_PATH) else None


#: Root's state directory: the unit's ``StateDirectory=memagent``.
SYSTEM_STATE_DIR = "/var/lib/memagent"


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


def agent_config(values: dict[str, Any], flags: dict[str, Any], socket: str) -> AgentConfig:
    """An :class:`AgentConfig` from file ``values`` and command-line ``flags`` (None: not
    given); flags win, what neither gives keeps its default. ConfigError: see check_names."""

    def given(**pairs: tuple[str | None, str]) -> dict[str, Any]:
        """field -> (flag, file key): the value of the flag, else of the key, if either is set."""
        out: dict[str, Any] = {}
        for name, (flag, key) in pairs.items():
            if flag is not None and flags.get(flag) is not None:
                out[name] = flags[flag]
            elif key in values:
                out[name] = values[key]
        return out

    stacks = StackConfig(**given(
        enabled=(None, "stacks.enabled"), budget=("stack_budget", "stacks.budget"),
        timeout=("stack_timeout", "stacks.timeout"), py_spy=("py_spy", "stacks.py_spy"),
        growth_threshold=(None, "stacks.growth_threshold"), rotation=(None, "stacks.rotation"),
        sampler=("stack_sampler", "stacks.sampler"), austin=("austin", "stacks.austin")))
    if flags.get("no_stacks"):
        stacks.enabled = False
    headroom = HeadroomConfig(**given(
        host_capacity=(None, "host.capacity"), host_reserve=(None, "host.reserve"),
        gpu_reserve=(None, "gpu.reserve"), pss_refresh=(None, "host.pss_refresh"),
        pss_drift=(None, "host.pss_drift"),
    ))
    alerts = AlertConfig(**{k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("alerts.")})
    alerts.recent = int(alerts.recent)
    alerts.budgets = values.get("budgets", {})
    record = RecordConfig(**{k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("record.")})
    record.enabled = record.enabled and not flags.get("no_record")
    config = AgentConfig(socket=socket, stacks=stacks, headroom=headroom, alerts=alerts, record=record,
                         metrics=metrics_config(values, flags), **given(
        interval=("interval", "interval"), auto=("auto", "auto"), auto_label=("auto_label", "auto_label"),
        auto_cmdline=("auto_cmdline", "auto_cmdline"),
        admin_group=("admin_group", "admin_group"), socket_group=("socket_group", "socket_group"),
        history_seconds=("history", "history"), status_refresh=("status_refresh", "status_refresh"),
        gpu=(None, "gpu.enabled"), netlink=(None, "events.netlink"), max_clients=(None, "clients.max"),
        max_clients_per_uid=(None, "clients.max_per_uid"), client_idle_timeout=(None, "clients.idle_timeout"),
        containers_root=(None, "containers.root"), nvmap_clients=(None, "gpu.nvmap_clients"),
    ))

    state = given(state_dir=("state_dir", "state_dir")).get("state_dir", default_state_dir(socket))
    config.state_dir = state or None  # "": off
    if flags.get("no_gpu"):
        config.gpu = False
    if flags.get("no_netlink"):
        config.netlink = False
    config.source = ConfigSource(dict(flags))
    check_names(config.auto_cmdline, config.auto_label)  # the file's and the flags' together
    return config


# ----------------------------------------------------------------------------- reload (SIGHUP)
#: What a running daemon cannot change: SIGHUP keeps the running value and says a restart
#: is needed (bound, paced, sized, opened or found at start: the socket, the tick, the rings,
#: NVML, netlink, py-spy and Austin; the recorder's sizes and retry period apply live).
RESTART_KEYS = frozenset({"socket", "socket_group", "state_dir", "interval", "history", "gpu.enabled",
                          "events.netlink", "stacks.enabled", "stacks.py_spy", "stacks.sampler", "stacks.austin",
                          "record.enabled", "metrics.listen", "containers.root", "gpu.nvmap_clients"})

#: The file key of each :class:`AgentConfig` attribute whose name differs from it.
_FILE_KEY = {
    "history_seconds": "history", "gpu": "gpu.enabled", "netlink": "events.netlink", "max_clients": "clients.max",
    "max_clients_per_uid": "clients.max_per_uid", "client_idle_timeout": "clients.idle_timeout",
    "containers_root": "containers.root", "nvmap_clients": "gpu.nvmap_clients",
    "headroom.host_capacity": "host.capacity", "headroom.host_reserve": "host.reserve",
    "headroom.gpu_reserve": "gpu.reserve", "headroom.pss_refresh": "host.pss_refresh",
    "headroom.pss_drift": "host.pss_drift", "alerts.budgets": "budgets",
}


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


def changed_keys(running: AgentConfig, new: AgentConfig) -> list[str]:
    """The file keys whose values differ between two configurations, in field order."""
    out: list[str] = []
    for name in (f.name for f in fields(AgentConfig) if f.name != "source"):
        old_value, new_value = getattr(running, name), getattr(new, name)
        if is_dataclass(old_value):
            for sub in fields(old_value):
                dotted = f"{name}.{sub.name}"
                if getattr(old_value, sub.name) != getattr(new_value, sub.name):
                    out.append(_FILE_KEY.get(dotted, dotted))
        elif old_value != new_value:
            out.append(_FILE_KEY.get(name, name))
    return out
