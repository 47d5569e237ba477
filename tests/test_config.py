"""The daemon's configuration: sizes, an invalid file naming its key (in the loader, in
``check-config`` and at daemon start), and the shipped example file."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import MiB, memagent_cli

from memagent.agent import Agent
from memagent.config import SCHEMA, agent_config, key_line, load, parse_size, validate
from memagent.config.checks import Number, Size, Whole
from memagent.errors import ConfigError


@pytest.mark.parametrize("text, expected", [
    ("512MiB", 512 * MiB), ("2G", 2 * 1024 * MiB), ("1.5GiB", int(1.5 * 1024 * MiB)), ("1000", 1000),
    (4096, 4096), ("1GB", 10**9), ("64k", 64 * 1024), ("2Gi", 2 * 1024 * MiB), ("512Mi", 512 * MiB),
])
def test_sizes(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("body, key", [
    ('interval = "fast"', "interval"),
    ("[host]\ncapacity = \"12 parsecs\"", "host.capacity"),
    ("[alerts]\nwarn_fraction = 0.9\ncritical_fraction = 0.5", "alerts.critical_fraction"),
    ("[alerts]\nhok = [\"x\"]", "alerts.hok"),
    ("intervall = 1", "intervall"),
    ("[budgets]\nbert = \"lots\"", "budgets.bert"),
    ("[stacks]\nsampler = \"perf\"", "stacks.sampler"),
    ("[stacks]\nsampler = 1", "stacks.sampler"),
    ("[stacks]\naustin = \"\"", "stacks.austin"),
])
@pytest.mark.e2e
def test_an_invalid_file_names_the_key(tmp_path: Path, body: str, key: str) -> None:
    path = tmp_path / "m.toml"
    path.write_text(body)
    with pytest.raises(ConfigError) as err:
        load(str(path))
    assert err.value.key == key
    r = memagent_cli("check-config", str(path))
    assert r.returncode == 2 and key in r.stderr
    r = memagent_cli("daemon", "--config", str(path), "--socket", str(tmp_path / "s.sock"))
    assert r.returncode == 2 and key in r.stderr and "invalid configuration" in r.stderr
    assert not (tmp_path / "s.sock").exists()


@pytest.mark.e2e
def test_the_example_configuration_is_valid() -> None:
    example = Path(__file__).resolve().parent.parent / "packaging" / "memagent.toml"
    values = load(str(example))
    assert values["host.capacity"] == 12 * 1024 * MiB and values["alerts.warn_fraction"] == 0.9
    r = memagent_cli("check-config", str(example))
    assert r.returncode == 0, r.stderr


def test_netlink_is_switched_off_by_the_file_or_the_flag() -> None:
    assert agent_config({}, {}, "/s").netlink is True
    assert agent_config(validate({"events": {"netlink": False}}), {}, "/s").netlink is False
    assert agent_config(validate({"events": {"netlink": True}}), {"no_netlink": True}, "/s").netlink is False
    with pytest.raises(ConfigError) as err:
        validate({"events": {"netlink": "no"}})
    assert err.value.key == "events.netlink"


# --------------------------------------------------------------- issue 12: values that validated, then killed

NUMBERS = {f"{s}.{k}" if isinstance(spec, dict) else s: c
           for s, spec in SCHEMA.items() for k, c in (spec.items() if isinstance(spec, dict) else [("", spec)])
           if isinstance(c, Number | Whole | Size)}


#: A key that must agree with another: that one, given the same value.
PARTNER = {"alerts.critical_fraction": "warn_fraction", "alerts.warn_fraction": "critical_fraction"}


def nested(key: str, value: object) -> dict[str, Any]:
    """``{"alerts": {"recent": value}}`` for ``alerts.recent``."""
    section, _, sub = key.partition(".")
    if key in PARTNER:
        return {section: {sub: value, PARTNER[key]: value}}
    return {section: {sub: value}} if sub else {section: value}


def refused(tmp_path: Path, body: str) -> ConfigError:
    path = tmp_path / "m.toml"
    path.write_text(body)
    with pytest.raises(ConfigError) as err:
        load(str(path))
    return err.value


@pytest.mark.parametrize("body, key, line, reason", [
    ("interval = 5e-324", "interval", 1, "out of range: 4.94066e-324 (from 0.01 to 60 seconds)"),
    ("interval = inf", "interval", 1, "not a finite number: inf"),
    ("interval = nan", "interval", 1, "not a finite number: nan"),
    ("# the tick\nstatus_refresh = inf", "status_refresh", 2, "not a finite number: inf"),
    ("[alerts]\nrecent = inf", "alerts.recent", 2, "not a finite number: inf"),
    ("[alerts]\nrecent = 1e9", "alerts.recent", 2, "out of range: 1e+09 (from 0 to 10000)"),
    ("history = 1e9", "history", 1, "out of range: 1e+09 (from 1 to 86400 seconds)"),
    ("\n[host]\ncapacity = 12", "host.capacity", 3, "12 has no unit"),
    ('[host]\ncapacity = "12"', "host.capacity", 2, "'12' has no unit"),
    ('[host]\ncapacity = "12B"', "host.capacity", 2, "out of range: 12B (from 1MiB to 1PiB)"),
    ('[host]\npss_drift = "1KiB"', "host.pss_drift", 2, "out of range: 1KiB (from 1MiB to 1PiB)"),
    ('[host]\npss_drift = "2PiB"', "host.pss_drift", 2, "not a size"),
    ('[host]\npss_drift = "2048TiB"', "host.pss_drift", 2, "out of range: 2PiB (from 1MiB to 1PiB)"),
    ("[host]\nreserve = " + "9" * 400, "host.reserve", 2, "out of range: 9.999e+399 bytes"),
    ('[gpu]\nreserve = "' + "9" * 400 + 'G"', "gpu.reserve", 2, "not a size: '99999999999999999999"),
    ('[gpu]\nreserve = "' + "9" * 30 + 'T"', "gpu.reserve", 2, "out of range: 1.099e+42 bytes"),
    ("interval = 1" + "0" * 400, "interval", 1, "out of range: 1.000e+400"),
    ("[stacks]\ntimeout = 0", "stacks.timeout", 2, "out of range: 0 (from 0.1 to 60 seconds)"),
    ("[alerts]\nhook_rate = 1e6", "alerts.hook_rate", 2, "out of range: 1e+06 (from 0.001 to 100 per second)"),
    ("[clients]\nmax = 100000", "clients.max", 2, "out of range: 100000 (from 9 to 10000)"),
    ('admin_group = "memagent-no-such-group"', "admin_group", 1, "no such group: 'memagent-no-such-group'"),
    ('\n\nsocket_group = "memagent-no-such-group"', "socket_group", 3, "no such group"),
    ('socket_group = "4294967295"', "socket_group", 1, "not a GID: 4294967295"),
    ('socket_group = "\u00b2"', "socket_group", 1, "no such group: '²'"),
    ('auto_label = ""', "auto_label", 1, "a label cannot be empty"),
    ('[alerts]\nhook = ["/nonexistent/page-oncall"]', "alerts.hook", 2, "no such program: '/nonexistent/page-oncall'"),
    ('[alerts]\nhook = ["memagent-no-such-program"]', "alerts.hook", 2, "no such program"),
    ('[alerts]\nhook = ["bin/page"]', "alerts.hook", 2, "a relative path: 'bin/page'"),
    ('[alerts]\nhook = ["/etc/passwd"]', "alerts.hook", 2, "not executable: '/etc/passwd'"),
    ('[alerts]\nhook = ["/bin/true"]\nhook_user = "memagent-no-such-user"', "alerts.hook_user", 3, "no such user"),
    ('[budgets]\nbert = 6', "budgets.bert", 2, "6 has no unit"),
    ('socket = "a\\u0000b"', "socket", 1, "a NUL character"),
])
def test_a_value_that_would_crash_or_misbehave_is_refused_naming_key_and_line(
        tmp_path: Path, body: str, key: str, line: int, reason: str) -> None:
    err = refused(tmp_path, body)
    assert (err.key, err.path) == (key, f"{tmp_path / 'm.toml'}:{line}")
    assert reason in err.reason


@pytest.mark.parametrize("key", sorted(NUMBERS))
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e308, -(10**400), 10**400])
def test_every_number_and_size_is_finite_and_bounded(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as err:
        validate(nested(key, value))
    assert err.value.key == key


@pytest.mark.parametrize("key", sorted(k for k, c in NUMBERS.items() if isinstance(c, Number | Whole)))
def test_every_range_holds_at_its_ends_and_refuses_past_them(key: str) -> None:
    check = NUMBERS[key]
    assert isinstance(check, Number | Whole)
    lo = check.lo if isinstance(check, Whole) or not check.above else check.lo + 1e-9
    for inside in (lo, check.hi):
        assert validate(nested(key, inside))[key] == inside
    for outside in (check.lo - 1 if isinstance(check, Whole) else lo - 1e-6 if not check.above else check.lo,
                    check.hi + 1):
        with pytest.raises(ConfigError, match="out of range"):
            validate(nested(key, outside))


@pytest.mark.parametrize("key", sorted(NUMBERS))
def test_an_agent_builds_and_ticks_at_both_ends_of_every_range(tmp_path: Path, key: str) -> None:
    """What passes validation never crashes the daemon (``recent = inf`` did, in int())."""
    check = NUMBERS[key]
    ends = [check.lo if not isinstance(check, Number) or not check.above else check.lo + 1e-9, check.hi]
    for end in ends:
        values = validate(nested(key, f"{end}B" if isinstance(check, Size) else end))
        agent = Agent(agent_config(values, {}, str(tmp_path / "s.sock")))
        agent.on_tick(time.time())


def test_sizes_without_a_unit_are_bytes_only_from_1_mib() -> None:
    assert validate({"host": {"capacity": MiB, "reserve": 0}}) == {"host.capacity": MiB, "host.reserve": 0}
    assert validate({"host": {"reserve": "0"}, "budgets": {"x": 0}}) == {"host.reserve": 0, "budgets": {"x": 0}}
    assert validate({"stacks": {"growth_threshold": "64KiB"}})["stacks.growth_threshold"] == 64 * 1024
    with pytest.raises(ConfigError, match=re.escape('write e.g. "65536GiB", "65536MiB" or "65536B"')):
        validate({"stacks": {"growth_threshold": 65536}})
    assert validate({"stacks": {"growth_threshold": "65536B"}})["stacks.growth_threshold"] == 65536


def test_groups_users_and_the_hook_are_resolved_when_checked(tmp_path: Path) -> None:
    hook = tmp_path / "hook.sh"
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    values = validate({"admin_group": "root", "socket_group": "0", "alerts": {"hook": [str(hook)]}})
    assert values == {"admin_group": "root", "socket_group": "0", "alerts.hook": [str(hook)]}
    assert validate({"alerts": {"hook": "true"}})["alerts.hook"] == ["true"]  # on the hook's PATH
    hook.chmod(0o644)
    with pytest.raises(ConfigError, match="not executable"):
        validate({"alerts": {"hook": [str(hook)]}})


@pytest.mark.parametrize("body, message", [
    ("intervall = 1", "intervall: unknown key (did you mean 'interval'?)"),
    ("[alerts]\nhok = []", "alerts.hok: unknown key (did you mean 'hook'?)"),
    ("[alert]\nhook = []", "alert: unknown key (did you mean 'alerts'?)"),
    ('[alerts]\nreserve = "1GiB"', "alerts.reserve: unknown key (did you mean 'host.reserve', under [host]?)"),
    ("zzz = 1", "zzz: unknown key"),
    ("[stacks]\nsampler_cpu = 0.25", "stacks.sampler_cpu: no longer a key: [stacks] cpu_budget replaces it (the "
                                     "share of one core all stack work may use, the daemon's own and py-spy's with "
                                     "Austin's; stacks.md)"),
])
def test_a_misspelt_key_gets_the_closest_one(tmp_path: Path, body: str, message: str) -> None:
    assert str(refused(tmp_path, body)).endswith(message)


def test_the_line_is_that_of_the_key_wherever_toml_puts_it() -> None:
    text = ('# interval = 0\n[alerts]\nhook = [\n  "/bin/true",\n  "recent = 5",\n]\nnote = """\nrecent = 1\n"""\n'
            'recent = inf\n[budgets]\n"bert.serve" = "1G"\n[host]\ncapacity = 12\n[clients]  # max = 1\n'
            'idle_timeout = 1\nmax = { a = 1 }\n')
    assert key_line(text, ("alerts", "hook")) == 3
    assert key_line(text, ("alerts", "note")) == 7
    assert key_line(text, ("alerts", "recent")) == 10
    assert key_line(text, ("budgets", "bert.serve")) == 12
    assert key_line(text, ("host", "capacity")) == 14
    assert key_line(text, ("clients",)) == 15
    assert key_line(text, ("clients", "max")) == 17
    assert key_line(text, ("interval",)) is None
    assert key_line("host.capacity = 1\n", ("host", "capacity")) == 1
    assert key_line("x = 1\r\ninterval = 2\r\n", ("interval",)) == 2


@pytest.mark.parametrize("raw, reason, line", [
    (b"interval = 0.5\n\xff\xfe = 1\n", "not UTF-8 text: byte 0xff", 2),
    (b"interval = 0.5\ninterval 1\n", "not valid TOML: Expected '=' after a key", 2),
    (b"a = " + b"[" * 5000 + b"]" * 5000, "not valid TOML: nested too deeply", None),
    (b"# x\n" * (MiB // 4 + 1), "larger than 1 MiB: not a configuration file", None),
    (b"interval = 1\nhistory = 1" + b"0" * 5000, "not valid TOML: a number too long", 2),
])
def test_a_file_that_is_not_a_toml_text_is_one_error(tmp_path: Path, raw: bytes, reason: str, line: int | None) -> None:
    path = tmp_path / "m.toml"
    path.write_bytes(raw)
    with pytest.raises(ConfigError) as err:
        load(str(path))
    assert err.value.key == "-" and reason in err.value.reason
    assert err.value.path == (str(path) if line is None else f"{path}:{line}")


def test_a_file_in_utf8_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_bytes(b"\xef\xbb\xbfinterval = 0.25\n")
    assert load(str(path)) == {"interval": 0.25}


def test_recent_is_a_whole_number() -> None:
    assert agent_config(validate({"alerts": {"recent": 5.0}}), {}, "/s").alerts.recent == 5
    with pytest.raises(ConfigError, match=re.escape("expected a whole number, got 0.5")):
        validate({"alerts": {"recent": 0.5}})


# --------------------------------------------------------------- issue 31: [oom_score_adj], [oom] trusted_users


def test_the_oom_table_and_its_users_are_read_into_the_oom_section() -> None:
    values = validate({"oom_score_adj": {"detector": -800, "trainer": 800}, "oom": {"trusted_users": ["root"]}})
    config = agent_config(values, {}, "/s")
    assert config.oom.scores == {"detector": -800, "trainer": 800} and config.oom.trusted_users == ["root"]
    assert agent_config({}, {}, "/s").oom.scores == {}


@pytest.mark.parametrize(("table", "message"), [
    ({"detector": -1001}, r"^oom_score_adj\.detector: -1001 is outside -1000 to 1000, the kernel's range"),
    ({"trainer": 1001}, r"^oom_score_adj\.trainer: 1001 is outside -1000 to 1000"),
    ({"detector": "-800"}, r"^oom_score_adj\.detector: expected an integer from -1000 to 1000, got '-800'$"),
    ({"detector": True}, r"^oom_score_adj\.detector: expected an integer"),
    ({"detector": -0.5}, r"^oom_score_adj\.detector: expected an integer"),
    ({"bad\tlabel": 1}, r"^oom_score_adj\.bad"),
], ids=["below", "above", "string", "bool", "float", "label"])
def test_a_wrong_oom_score_adj_is_one_line_naming_the_label(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        validate({"oom_score_adj": table})
    assert "\n" not in str(err.value)


def test_an_oom_trusted_user_that_is_no_user_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^oom\.trusted_users: no such user: 'no-such-user-31'$"):
        validate({"oom": {"trusted_users": ["no-such-user-31"]}})
