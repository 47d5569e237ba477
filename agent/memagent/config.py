"""The daemon's TOML configuration: defaults, file, then command-line flags.

``--config FILE``, else ``/etc/memagent/memagent.toml`` when present. Every key is listed
in ``docs/configuration.md`` and ``packaging/memagent.toml``; an unknown key or a wrong
value is an error naming the key, so a typo never silently keeps a default. Sizes take
``512MiB``, ``2G``, ``1.5GiB`` or a number of bytes (K/M/G/T and KiB/MiB/GiB/TiB are
binary; KB/MB/GB/TB are decimal).
"""

from __future__ import annotations

import os
import pwd
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_PATH = "/etc/memagent/memagent.toml"
#: Of ``[clients] max``, these are only for root and admin-group clients: a crowd of one
#: user's connections never locks an operator out.
RESERVED_FOR_ADMINS = 8
MiB = 1024 * 1024

_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kib": 1024, "m": MiB, "mib": MiB, "g": 1024 * MiB, "gib": 1024 * MiB,
    "t": 1024**4, "tib": 1024**4,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: object, key: str = "size") -> int:
    """Bytes from ``512MiB``, ``2G``, ``1.5GiB``, ``1000000`` or an integer."""
    if isinstance(value, bool):
        raise ConfigError(key, "expected a size such as 512MiB, 2G or a number of bytes")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(key, "a size cannot be negative")
        return value
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m and m.group(2).lower() in _UNITS:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise ConfigError(key, f"not a size: {value!r} (use e.g. 512MiB, 2G, 1.5GiB or bytes)")


@dataclass
class HeadroomConfig:
    #: Memory the watched processes may use altogether; None: derived (see docs/headroom.md).
    host_capacity: int | None = None
    #: Kept free for everything else (used only when capacity is derived).
    host_reserve: int = 256 * MiB
    gpu_reserve: int = 256 * MiB
    #: Seconds between two PSS reads of a process (smaps_rollup holds its mmap lock).
    pss_refresh: float = 30.0


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


@dataclass
class AgentConfig:
    """Everything an agent (daemon, embedded or demo) is built from."""

    socket: str
    interval: float = 0.5
    auto: list[str] = field(default_factory=list)
    #: Label given to auto-attached processes.
    auto_label: str | None = None
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
    stacks: StackConfig = field(default_factory=StackConfig)
    headroom: HeadroomConfig = field(default_factory=HeadroomConfig)
    alerts: AlertConfig = field(default_factory=AlertConfig)


# ----------------------------------------------------------------------------- schema

Check = Callable[[object, str], Any]


def _float(lo: float = 0.0, hi: float | None = None, exclusive_lo: bool = True) -> Check:
    def check(v: object, key: str) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ConfigError(key, f"expected a number, got {v!r}")
        x = float(v)
        if (x <= lo if exclusive_lo else x < lo) or (hi is not None and x > hi):
            raise ConfigError(key, f"out of range: {x:g}")
        return x
    return check


def _str(v: object, key: str) -> str:
    if not isinstance(v, str):
        raise ConfigError(key, f"expected a string, got {v!r}")
    return v


def _bool(v: object, key: str) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(key, f"expected true or false, got {v!r}")
    return v


def _str_list(v: object, key: str) -> list[str]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ConfigError(key, "expected a list of strings")
    return list(v)


def _count(v: object, key: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(key, f"expected a whole number, got {v!r}")
    if v < 1:
        raise ConfigError(key, f"out of range: {v}")
    return v


def lookup_user(name: str, key: str = "alerts.hook_user") -> pwd.struct_passwd:
    """The user database's entry for a user name or a numeric UID; ConfigError if none."""
    try:
        return pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, OverflowError):
        raise ConfigError(key, f"no such user: {name!r}") from None


def _user(v: object, key: str) -> str:
    name = _str(v, key)
    lookup_user(name, key)
    return name


def _size(v: object, key: str) -> int:
    return parse_size(v, key)


def _budgets(v: object, key: str) -> dict[str, int]:
    if not isinstance(v, dict):
        raise ConfigError(key, "expected a table of label = size")
    return {str(label): parse_size(size, f"{key}.{label}") for label, size in v.items()}


#: Every key, with its check: the file may hold these and nothing else.
SCHEMA: dict[str, dict[str, Check] | Check] = {
    "interval": _float(),
    "socket": _str,
    "auto": _str_list,
    "auto_label": _str,
    "admin_group": _str,
    "socket_group": _str,
    "history": _float(),
    "status_refresh": _float(),
    "host": {"capacity": _size, "reserve": _size, "pss_refresh": _float()},
    "gpu": {"enabled": _bool, "reserve": _size},
    "events": {"netlink": _bool},
    "stacks": {"enabled": _bool, "budget": _float(), "timeout": _float(), "py_spy": _str,
               "growth_threshold": _size, "rotation": _float()},
    "alerts": {
        "warn_fraction": _float(0.0, 10.0),
        "critical_fraction": _float(0.0, 10.0),
        "hysteresis": _float(0.0, 0.5, exclusive_lo=False),
        "hook": _str_list,
        "hook_timeout": _float(),
        "hook_user": _user,
        "hook_min_interval": _float(0.0, exclusive_lo=False),
        "hook_rate": _float(),
        "hook_burst": _count,
        "pressure_threshold": _float(0.0, 100.0),
        "leak_window": _float(),
        "leak_min_rate": _size,
        "leak_horizon": _float(),
        "recent": _float(),
    },
    "budgets": _budgets,
    "clients": {"max": _count, "max_per_uid": _count, "idle_timeout": _float()},
}


def validate(data: dict[str, Any], path: str | None = None) -> dict[str, Any]:
    """The checked values, flattened to ``section.key``; raises ConfigError."""
    out: dict[str, Any] = {}
    try:
        for key, value in data.items():
            spec = SCHEMA.get(key)
            if spec is None:
                raise ConfigError(key, "unknown key")
            if isinstance(spec, dict):
                if not isinstance(value, dict):
                    raise ConfigError(key, "expected a table")
                for sub, v in value.items():
                    check = spec.get(sub)
                    if check is None:
                        raise ConfigError(f"{key}.{sub}", "unknown key")
                    out[f"{key}.{sub}"] = check(v, f"{key}.{sub}")
            else:
                out[key] = spec(value, key)
        if out.get("alerts.critical_fraction", 1.0) < out.get("alerts.warn_fraction", 0.9):
            raise ConfigError("alerts.critical_fraction", "must not be below alerts.warn_fraction")
        if out.get("clients.max", RESERVED_FOR_ADMINS + 1) <= RESERVED_FOR_ADMINS:
            raise ConfigError("clients.max", f"must be above the {RESERVED_FOR_ADMINS} connections kept for root")
        if out.get("alerts.hook") == []:
            raise ConfigError("alerts.hook", "an empty command; leave the key out for no hook")
    except ConfigError as exc:
        raise exc.at(path) from None
    return out


def load(path: str) -> dict[str, Any]:
    """Read and validate a config file."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError("-", f"cannot read: {exc.strerror}", path) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("-", f"not valid TOML: {exc}", path) from None
    return validate(data, path)


def default_path() -> str | None:
    return DEFAULT_PATH if os.path.exists(DEFAULT_PATH) else None


def agent_config(values: dict[str, Any], flags: dict[str, Any], socket: str) -> AgentConfig:
    """An :class:`AgentConfig` from file ``values`` and command-line ``flags`` (None: not
    given); flags win, and what neither gives keeps the dataclass's own default."""

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
    ))
    if flags.get("no_stacks"):
        stacks.enabled = False
    headroom = HeadroomConfig(**given(
        host_capacity=(None, "host.capacity"), host_reserve=(None, "host.reserve"),
        gpu_reserve=(None, "gpu.reserve"), pss_refresh=(None, "host.pss_refresh"),
    ))
    alerts = AlertConfig(**{k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("alerts.")})
    alerts.recent = int(alerts.recent)
    alerts.budgets = values.get("budgets", {})
    config = AgentConfig(socket=socket, stacks=stacks, headroom=headroom, alerts=alerts, **given(
        interval=("interval", "interval"), auto=("auto", "auto"), auto_label=("auto_label", "auto_label"),
        admin_group=("admin_group", "admin_group"), socket_group=("socket_group", "socket_group"),
        history_seconds=("history", "history"), status_refresh=("status_refresh", "status_refresh"),
        gpu=(None, "gpu.enabled"), netlink=(None, "events.netlink"), max_clients=(None, "clients.max"),
        max_clients_per_uid=(None, "clients.max_per_uid"), client_idle_timeout=(None, "clients.idle_timeout"),
    ))

    if flags.get("no_gpu"):
        config.gpu = False
    if flags.get("no_netlink"):
        config.netlink = False
    return config
