"""The schema: every key the file may hold, with its check, derived from the one table
(:data:`memagent.config.sections.KEYS`), and the one validation of the file and the flags.

One validation for the file (``memagent check-config``, ``memagent daemon``) and for the
daemon's flags (:func:`check_text`, the type of each flag): a value either passes here or
is refused with :class:`ConfigError` naming its key, so nothing that passes can crash the
daemon later (no NaN or infinity, no size or period it cannot hold). Ranges: listed in
``docs/configuration.md``'s key table, generated from the same declarations.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError
from .auto import check_file
from .checks import MAX_HISTORY_SLOTS, Check, Number, Whole, shown, user
from .keys import Table
from .sections import KEYS, RETIRED, default_of

#: The schema's shape: a top-level key's check, or a table's keys and their checks.
Schema = dict[str, dict[str, Check] | Check]


def schema_of(table: Table) -> Schema:
    """The file's shape from a table of keys: ``{"interval": check, "stacks": {"budget": check, ...}}``,
    tables where their first key is."""
    schema: Schema = {}
    for row in table:
        k = row.key
        if k.section is None:
            schema[k.file] = k.check
        else:
            sub = schema.setdefault(k.section, {})
            assert isinstance(sub, dict)
            sub[k.name] = k.check
    return schema


#: Every key, with its check: the file may hold these and nothing else.
SCHEMA: Schema = schema_of(KEYS)


def check_of(key: str, schema: Schema = SCHEMA) -> Check:
    """The check of a dotted key (``interval``, ``stacks.budget``)."""
    section, _, sub = key.partition(".")
    spec = schema[section]
    return spec[sub] if isinstance(spec, dict) else spec


def check_text(key: str, text: str, schema: Schema = SCHEMA) -> Any:
    """A command-line value for ``key``, through the key's own check."""
    return text_value(check_of(key, schema), key, text)


def text_value(check: Check, key: str, text: str) -> Any:
    """A command-line ``text`` through ``check`` (of ``key``): a number's check gets a number."""
    value: object = text
    if isinstance(check, Number | Whole):
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(key, f"not a number: {shown(text)}") from None
        if not math.isfinite(value):
            raise ConfigError(key, f"not a finite number: {shown(text)}")
    return check(value, key)


def suggest(key: str, section: str | None, schema: Schema = SCHEMA) -> str:
    """`` (did you mean 'x'?)`` for a misspelt ``key`` of ``section`` (None: top level)."""
    spec = schema if section is None else schema[section]
    assert isinstance(spec, dict)
    import difflib  # only for a misspelt key

    close = difflib.get_close_matches(key, list(spec), n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    elsewhere = [f"{s}.{key}" for s, sub in schema.items() if isinstance(sub, dict) and key in sub and s != section]
    return f" (did you mean {elsewhere[0]!r}, under [{elsewhere[0].split('.')[0]}]?)" if elsewhere else ""


#: A key of the data, as a path of table names (``("alerts", "hook")``).
Where = tuple[str, ...]


class Refused(ConfigError):
    """A ConfigError that also says where in the data its key is (``where``), to find
    the key's line in the file; :func:`memagent.config.file.validate` raises it as a plain one."""

    def __init__(self, error: ConfigError, where: Where) -> None:
        super().__init__(error.key, error.reason, error.path)
        self.where = where


def _checked(check: Check, value: object, key: str, where: Where) -> Any:
    try:
        return check(value, key)
    except ConfigError as exc:
        inner = exc.key[len(key) + 1:] if exc.key.startswith(f"{key}.") else None  # budgets.LABEL
        raise Refused(exc, where if inner is None else (*where, inner)) from None


def _check_keys(data: dict[str, Any], schema: Schema) -> dict[str, Any]:
    """Each key on its own: the checked values, flattened to ``section.key``."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        spec = schema.get(key)
        if spec is None:
            raise Refused(ConfigError(key, "unknown key" + suggest(key, None, schema)), (key,))
        if isinstance(spec, dict):
            if not isinstance(value, dict):
                raise Refused(ConfigError(key, "expected a table"), (key,))
            for sub, v in value.items():
                check = spec.get(sub)
                if check is None:
                    why = RETIRED.get(f"{key}.{sub}") or "unknown key" + suggest(sub, key, schema)
                    raise Refused(ConfigError(f"{key}.{sub}", why), (key, sub))
                out[f"{key}.{sub}"] = _checked(check, v, f"{key}.{sub}", (key, sub))
        else:
            out[key] = _checked(spec, value, key, (key,))
    return out


def _check_together(values: dict[str, Any]) -> None:
    """What no key decides alone."""
    _checked(lambda v, k: check_file(values), None, "auto_label", ("auto_label",))
    if values.get("alerts.critical_fraction", default_of("alerts.critical_fraction")) < \
            values.get("alerts.warn_fraction", default_of("alerts.warn_fraction")):
        where = ("alerts", "critical_fraction" if "alerts.critical_fraction" in values else "warn_fraction")
        raise Refused(ConfigError("alerts.critical_fraction", "must not be below alerts.warn_fraction"), where)
    if "alerts.hook" in values and "alerts.hook_user" not in values:
        # The default user, whom a root daemon runs the hook as: it must exist too.
        _checked(user, default_of("alerts.hook_user"), "alerts.hook_user", ("alerts", "hook"))
    if values.get("record.segment_bytes", 0) * 2 > values.get("record.max_bytes", default_of("record.max_bytes")):
        where = ("record", "segment_bytes")
        raise Refused(ConfigError("record.segment_bytes", "must be at most half of record.max_bytes"), where)
    slots = values.get("history", default_of("history")) / max(1.0, values.get("interval", default_of("interval")))
    if slots > MAX_HISTORY_SLOTS:
        raise Refused(ConfigError("history", f"{slots:.0f} slots per process, at most {MAX_HISTORY_SLOTS}"),
                      ("history",))


def check_all(data: dict[str, Any], schema: Schema = SCHEMA) -> dict[str, Any]:
    """The checked values of the parsed file ``data``, flattened to ``section.key``;
    raises :class:`Refused`."""
    values = _check_keys(data, schema)
    _check_together(values)
    return values
