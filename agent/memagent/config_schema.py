"""Every key of the daemon's configuration, with its check and its range.

One validation for the file (``memagent check-config``, ``memagent daemon``) and for the
daemon's flags (:func:`check_text`, the type of each flag): a value either passes here or
is refused with :class:`ConfigError` naming its key, so nothing that passes can crash the
daemon later (no NaN or infinity, no size or period it cannot hold). Ranges: listed in
``docs/configuration.md``. Sizes: :func:`parse_size` (without a unit, 0 or at least 1 MiB).
"""

from __future__ import annotations

import difflib
import grp
import math
import os
import pwd
import re
import shutil
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from memproto.text import label_problem

from .config_auto import AUTO_SCHEMA, check_file
from .config_metrics import METRICS_SCHEMA
from .errors import ConfigError

#: Of ``[clients] max``, these are only for root and admin-group clients: a crowd of one
#: user's connections never locks an operator out.
RESERVED_FOR_ADMINS = 8
KiB = 1024
MiB = 1024 * 1024
#: No size may exceed this (1 PiB): beyond it, a number is a typo, not a machine.
MAX_SIZE = 1024**5
#: A size written without a unit must be 0 or at least this: ``12`` is not 12 bytes.
MIN_BARE_SIZE = MiB
#: Per-process history slots, at most (4 bytes each, allocated when a process is attached).
MAX_HISTORY_SLOTS = 86_400
#: Where the hook's program is looked for when it has no ``/`` (the hook's own ``PATH``).
HOOK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The largest GID the kernel takes ((gid_t) -1 means "no change").
MAX_GID = 2**32 - 2

_UNITS = {
    "": 1, "b": 1,
    "k": KiB, "kib": KiB, "m": MiB, "mib": MiB, "g": 1024 * MiB, "gib": 1024 * MiB,
    "t": 1024**4, "tib": 1024**4,
    "ki": KiB, "mi": MiB, "gi": 1024 * MiB, "ti": 1024**4,  # Kubernetes' spelling (2Gi)
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
}
_SIZE = re.compile(r"^\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([a-zA-Z]*)\s*$")  # 30 digits: far past 1 PiB


def _size_parts(value: object, key: str) -> tuple[int, bool]:
    """(bytes, whether a unit was written)."""
    if isinstance(value, bool):
        raise ConfigError(key, "expected a size such as 512MiB, 2G or a number of bytes")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(key, "a size cannot be negative")
        return value, False
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m and m.group(2).lower() in _UNITS:
            # Exact: a float of a long number would be inf, and int(inf) raises.
            return int(Fraction(m.group(1)) * _UNITS[m.group(2).lower()]), bool(m.group(2))
    raise ConfigError(key, f"not a size: {_r(value)} (use e.g. 512MiB, 2G, 1.5GiB or bytes)")


def parse_size(value: object, key: str = "size") -> int:
    """Bytes from ``512MiB``, ``2G``, ``1.5GiB``, ``2Gi``, ``1000000`` or an integer."""
    return _size_parts(value, key)[0]


def _r(value: object) -> str:
    """``repr(value)``, cut short: an error stays one readable line."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}…({len(text)} characters)"


def _bound(x: float) -> str:
    """A number as a message shows it: ``0.01``, ``1e+09``; an integer too long for a float too."""
    if isinstance(x, int) and abs(x) >= 10**15:
        digits = str(abs(x))
        return f"{'-' if x < 0 else ''}{digits[0]}.{digits[1:4]}e+{len(digits) - 1}"
    return f"{x:g}"


def _human(n: int) -> str:
    if n >= 10**18:
        return f"{_bound(n)} bytes"
    for unit, size in (("PiB", 1024**5), ("TiB", 1024**4), ("GiB", 1024**3), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


Check = Callable[[object, str], Any]


class Number:
    """A finite number from ``lo`` to ``hi`` (above ``lo`` when ``above``), in ``unit``."""

    def __init__(self, lo: float, hi: float, unit: str = "", *, above: bool = False) -> None:
        self.lo, self.hi, self.unit, self.above = lo, hi, unit, above

    @property
    def range(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        low = f"above {_bound(self.lo)}" if self.above else f"from {_bound(self.lo)}"
        return f"{low} to {_bound(self.hi)}{unit}"

    def __call__(self, v: object, key: str) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ConfigError(key, f"expected a number, got {_r(v)}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(key, f"not a finite number: {_r(v)}")
        # Compared before float(): an integer past 1e308 has no float.
        if (v <= self.lo if self.above else v < self.lo) or v > self.hi:
            raise ConfigError(key, f"out of range: {_bound(v)} ({self.range})")
        return float(v)


class Whole:
    """A whole number from ``lo`` to ``hi`` (``2.0`` is taken as 2)."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi

    def __call__(self, v: object, key: str) -> int:
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(key, f"not a finite number: {_r(v)}")
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(key, f"expected a whole number, got {_r(v)}")
        if not self.lo <= v <= self.hi:
            raise ConfigError(key, f"out of range: {_bound(v)} (from {self.lo} to {self.hi})")
        return v


class Size:
    """A size from ``lo`` to ``hi`` bytes; without a unit, 0 or at least 1 MiB."""

    def __init__(self, lo: int = 0, hi: int = MAX_SIZE) -> None:
        self.lo, self.hi = lo, hi

    def __call__(self, v: object, key: str) -> int:
        n, unit = _size_parts(v, key)
        if not unit and 0 < n < MIN_BARE_SIZE:
            raise ConfigError(key, f"{_r(v)} has no unit (bytes then, and under 1MiB surely not meant): "
                                   f"write e.g. \"{n}GiB\", \"{n}MiB\" or \"{n}B\"")
        if not self.lo <= n <= self.hi:
            raise ConfigError(key, f"out of range: {_human(n)} (from {_human(self.lo)} to {_human(self.hi)})")
        return n


def _str(v: object, key: str) -> str:
    if not isinstance(v, str):
        raise ConfigError(key, f"expected a string, got {_r(v)}")
    if "\0" in v:
        raise ConfigError(key, f"a NUL character in {_r(v)}")
    return v


def _name(v: object, key: str) -> str:
    """A non-empty string: a path, a program, a user or group."""
    if not _str(v, key):
        raise ConfigError(key, "empty; leave the key out for the default")
    return str(v)


def _state_dir(v: object, key: str) -> str:
    """An absolute directory path, or empty: keep no state (see memagent.store.state)."""
    path = _str(v, key)
    if path and not path.startswith("/"):
        raise ConfigError(key, f"a relative path: {_r(path)} (give the full path, or \"\" for no state)")
    return path


def _bool(v: object, key: str) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(key, f"expected true or false, got {_r(v)}")
    return v


def _str_list(v: object, key: str) -> list[str]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ConfigError(key, "expected a list of strings")
    return [_str(x, key) for x in v]


def _label(v: object, key: str) -> str:
    problem = label_problem(_str(v, key))
    if problem is not None:
        raise ConfigError(key, problem)
    return str(v)


def lookup_user(name: str, key: str = "alerts.hook_user") -> pwd.struct_passwd:
    """The user database's entry for a user name or a numeric UID; ConfigError if none."""
    try:
        return pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, OverflowError, ValueError):
        raise ConfigError(key, f"no such user: {_r(name)}") from None


def _user(v: object, key: str) -> str:
    name = _str(v, key)
    lookup_user(name, key)
    return name


def _group(v: object, key: str) -> str:
    """A group name that exists (looked up now), or a numeric GID."""
    name = _name(v, key)
    if name.isascii() and name.isdigit():  # not "²": str.isdigit() says yes, int() no
        if int(name) > MAX_GID:
            raise ConfigError(key, f"not a GID: {name} (at most {MAX_GID})")
        return name
    try:
        grp.getgrnam(name)
    except (KeyError, ValueError):
        raise ConfigError(key, f"no such group: {_r(name)}") from None
    return name


def _hook(v: object, key: str) -> list[str]:
    argv = _str_list(v, key)
    if not argv:
        raise ConfigError(key, "an empty command; leave the key out for no hook")
    program = argv[0]
    if "/" in program and not program.startswith("/"):
        raise ConfigError(key, f"a relative path: {_r(program)} (the hook runs in /: give the full path)")
    found = shutil.which(program, path=HOOK_PATH) if "/" not in program else program
    if not found or not os.path.isfile(found):
        raise ConfigError(key, f"no such program: {_r(program)}" + ("" if "/" in program else f" (PATH={HOOK_PATH})"))
    if not os.access(found, os.X_OK):
        raise ConfigError(key, f"not executable: {_r(program)}")
    return argv


def _sampler(v: object, key: str) -> str:
    if v not in ("austin", "dumps", "off"):
        raise ConfigError(key, f"expected \"austin\", \"dumps\" or \"off\", got {_r(v)}")
    return str(v)


def _budgets(v: object, key: str) -> dict[str, int]:
    if not isinstance(v, dict):
        raise ConfigError(key, "expected a table of label = size")
    size = Size()
    return {_label(label, f"{key}.{label}"): size(value, f"{key}.{label}") for label, value in v.items()}


SECONDS, DAY = "seconds", 86_400.0

#: Every key, with its check: the file may hold these and nothing else.
SCHEMA: dict[str, dict[str, Check] | Check] = {
    "interval": Number(0.01, 60.0, SECONDS),
    "socket": _name,
    "state_dir": _state_dir,
    **AUTO_SCHEMA,
    "admin_group": _group,
    "socket_group": _group,
    "history": Number(1.0, DAY, SECONDS),
    "status_refresh": Number(0.01, 600.0, SECONDS),
    "host": {"capacity": Size(MiB), "reserve": Size(), "pss_refresh": Number(1.0, DAY, SECONDS),
             "pss_drift": Size(MiB)},
    "gpu": {"enabled": _bool, "reserve": Size(), "nvmap_clients": _state_dir},
    "events": {"netlink": _bool},
    "containers": {"root": _state_dir},
    "stacks": {"enabled": _bool, "budget": Number(0.01, 100.0, "per second"), "timeout": Number(0.1, 60.0, SECONDS),
               "py_spy": _name, "growth_threshold": Size(64 * KiB), "rotation": Number(1.0, DAY, SECONDS),
               "sampler": _sampler, "austin": _name},
    "alerts": {
        "warn_fraction": Number(0.0, 10.0, above=True),
        "critical_fraction": Number(0.0, 10.0, above=True),
        "hysteresis": Number(0.0, 0.5),
        "hook": _hook,
        "hook_timeout": Number(0.1, 600.0, SECONDS),
        "hook_user": _user,
        "hook_min_interval": Number(0.0, DAY, SECONDS),
        "hook_rate": Number(0.001, 100.0, "per second"),
        "hook_burst": Whole(1, 100),
        "pressure_threshold": Number(0.0, 100.0, "percent", above=True),
        "leak_window": Number(1.0, DAY, SECONDS),
        "leak_min_rate": Size(KiB),
        "leak_horizon": Number(60.0, 365 * DAY, SECONDS),
        "recent": Whole(0, 10_000),
    },
    "budgets": _budgets,
    "record": {"enabled": _bool, "max_bytes": Size(MiB), "segment_bytes": Size(4 * KiB, 16 * MiB),
               "retry_interval": Number(0.1, 3600.0, SECONDS)},
    "clients": {"max": Whole(RESERVED_FOR_ADMINS + 1, 10_000), "max_per_uid": Whole(1, 10_000),
                "idle_timeout": Number(0.1, DAY, SECONDS)},
    "metrics": METRICS_SCHEMA,
}


def check_of(key: str) -> Check:
    """The check of a dotted key (``interval``, ``stacks.budget``)."""
    section, _, sub = key.partition(".")
    spec = SCHEMA[section]
    return spec[sub] if isinstance(spec, dict) else spec


def check_text(key: str, text: str) -> Any:
    """A command-line value for ``key``, through the key's own check."""
    check = check_of(key)
    value: object = text
    if isinstance(check, Number | Whole):
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(key, f"not a number: {_r(text)}") from None
        if not math.isfinite(value):
            raise ConfigError(key, f"not a finite number: {_r(text)}")
    return check(value, key)


def suggest(key: str, section: str | None) -> str:
    """`` (did you mean 'x'?)`` for a misspelt ``key`` of ``section`` (None: top level)."""
    spec = SCHEMA if section is None else SCHEMA[section]
    assert isinstance(spec, dict)
    close = difflib.get_close_matches(key, list(spec), n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    elsewhere = [f"{s}.{key}" for s, sub in SCHEMA.items() if isinstance(sub, dict) and key in sub and s != section]
    return f" (did you mean {elsewhere[0]!r}, under [{elsewhere[0].split('.')[0]}]?)" if elsewhere else ""


#: A key of the data, as a path of table names (``("alerts", "hook")``).
Where = tuple[str, ...]


class Refused(ConfigError):
    """A ConfigError that also says where in the data its key is (``where``), to find
    the key's line in the file; :func:`memagent.config.validate` raises it as a plain one."""

    def __init__(self, error: ConfigError, where: Where) -> None:
        super().__init__(error.key, error.reason, error.path)
        self.where = where


def _checked(check: Check, value: object, key: str, where: Where) -> Any:
    try:
        return check(value, key)
    except ConfigError as exc:
        inner = exc.key[len(key) + 1:] if exc.key.startswith(f"{key}.") else None  # budgets.LABEL
        raise Refused(exc, where if inner is None else (*where, inner)) from None


def _check_keys(data: dict[str, Any]) -> dict[str, Any]:
    """Each key on its own: the checked values, flattened to ``section.key``."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        spec = SCHEMA.get(key)
        if spec is None:
            raise Refused(ConfigError(key, "unknown key" + suggest(key, None)), (key,))
        if isinstance(spec, dict):
            if not isinstance(value, dict):
                raise Refused(ConfigError(key, "expected a table"), (key,))
            for sub, v in value.items():
                check = spec.get(sub)
                if check is None:
                    raise Refused(ConfigError(f"{key}.{sub}", "unknown key" + suggest(sub, key)), (key, sub))
                out[f"{key}.{sub}"] = _checked(check, v, f"{key}.{sub}", (key, sub))
        else:
            out[key] = _checked(spec, value, key, (key,))
    return out


def _check_together(values: dict[str, Any]) -> None:
    """What no key decides alone."""
    _checked(lambda v, k: check_file(values), None, "auto_label", ("auto_label",))
    if values.get("alerts.critical_fraction", 1.0) < values.get("alerts.warn_fraction", 0.9):
        where = ("alerts", "critical_fraction" if "alerts.critical_fraction" in values else "warn_fraction")
        raise Refused(ConfigError("alerts.critical_fraction", "must not be below alerts.warn_fraction"), where)
    if "alerts.hook" in values and "alerts.hook_user" not in values:
        # The default user, whom a root daemon runs the hook as: it must exist too.
        _checked(_user, "nobody", "alerts.hook_user", ("alerts", "hook"))
    if values.get("record.segment_bytes", 0) * 2 > values.get("record.max_bytes", 256 * MiB):
        where = ("record", "segment_bytes")
        raise Refused(ConfigError("record.segment_bytes", "must be at most half of record.max_bytes"), where)
    slots = values.get("history", 600.0) / max(1.0, values.get("interval", 0.5))
    if slots > MAX_HISTORY_SLOTS:
        raise Refused(ConfigError("history", f"{slots:.0f} slots per process, at most {MAX_HISTORY_SLOTS}"),
                      ("history",))


def check_all(data: dict[str, Any]) -> dict[str, Any]:
    """The checked values of the parsed file ``data``, flattened to ``section.key``;
    raises :class:`Refused`."""
    values = _check_keys(data)
    _check_together(values)
    return values
