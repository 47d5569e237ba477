"""The daemon's configuration: sizes, an invalid file naming its key (in the loader, in
``check-config`` and at daemon start), and the shipped example file."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import MiB, memagent_cli

from memagent.config import agent_config, load, parse_size, validate
from memagent.errors import ConfigError


@pytest.mark.parametrize("text, expected", [
    ("512MiB", 512 * MiB), ("2G", 2 * 1024 * MiB), ("1.5GiB", int(1.5 * 1024 * MiB)), ("1000", 1000),
    (4096, 4096), ("1GB", 10**9), ("64k", 64 * 1024),
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
])
def test_an_invalid_file_names_the_key(tmp_path: Path, body: str, key: str) -> None:
    path = tmp_path / "m.toml"
    path.write_text(body)
    with pytest.raises(ConfigError) as err:
        load(str(path))
    assert err.value.key == key
    r = memagent_cli("check-config", str(path))
    assert r.returncode == 1 and key in r.stderr
    r = memagent_cli("daemon", "--config", str(path), "--socket", str(tmp_path / "s.sock"))
    assert r.returncode == 2 and key in r.stderr and "invalid configuration" in r.stderr
    assert not (tmp_path / "s.sock").exists()


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
