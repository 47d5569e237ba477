"""SIGHUP and the one table of keys: a restart key keeps its running value (the
``[stacks] sampler`` bug: it was switched at once while the log said "kept until restart"),
each live key reaches the part that uses it, and a key added as one declared field shows
up in every artefact derived from the table (check-config's schema, the flags, the merge,
the reload split, the doc table).
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import Daemon, poll

from memagent.agent import Agent
from memagent.config import (
    LIVE,
    RESTART,
    AgentConfig,
    ConfigError,
    StackConfig,
    agent_config,
    copy_live,
    key,
    keys_of,
    split_changes,
    validate,
)
from memagent.config.checks import Choice, Number
from memagent.config.doc import markdown
from memagent.config.flags import add_flags
from memagent.config.keys import flag
from memagent.config.schema import schema_of
from memagent.config.sections import KEYS
from memagent.proc.pyspy import find_py_spy

KEPT = "stacks.sampler changed but only a restart applies it (running value kept)"


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    config = AgentConfig(socket=str(tmp_path / "s.sock"), gpu=False, netlink=False,
                         stacks=StackConfig(sampler="dumps"))
    a = Agent(config)
    yield a
    a.alerts.close()
    a.registry.close()


def test_a_reload_keeps_the_sampler_and_applies_the_live_keys_beside_it(agent: Agent) -> None:
    running = agent.config
    new = dataclasses.replace(running, stacks=StackConfig(sampler="off", austin="/nowhere/austin", budget=2.0),
                              alerts=dataclasses.replace(running.alerts, warn_fraction=0.5, recent=7),
                              max_clients=20)
    applied, kept = agent.reload(new)
    assert applied == ["clients.max", "stacks.budget", "alerts.warn_fraction", "alerts.recent"]
    assert kept == ["stacks.sampler", "stacks.austin"]
    assert (agent.stacks.config is running.stacks, running.stacks.sampler, running.stacks.austin) == \
        (True, "dumps", None)
    assert agent.stacks.sampler == ("dumps" if agent.stacks.usable else "off")
    assert (agent.stacks.bucket.rate, agent.alerts.config.warn_fraction, agent.alerts.book.recent.maxlen) == \
        (2.0, 0.5, 7)
    assert agent.server.max_clients == 20


def test_a_reload_with_only_restart_keys_applies_nothing(agent: Agent) -> None:
    new = dataclasses.replace(agent.config, interval=0.2, stacks=StackConfig(sampler="austin"))
    assert agent.reload(new) == ([], ["interval", "stacks.sampler"])
    assert (agent.config.interval, agent.config.stacks.sampler) == (0.5, "dumps")


@pytest.mark.skipif(find_py_spy(None) is None, reason="the sampler is 'dumps' only where py-spy is found")
def test_sighup_changing_the_sampler_and_a_live_key_keeps_the_sampler(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    cfg = tmp_path / "memagent.toml"
    cfg.write_text('[stacks]\nsampler = "dumps"\n[alerts]\nwarn_fraction = 0.9\n')
    d = start_daemon("--config", str(cfg), "--interval", "0.1", "--no-gpu", "--state-dir", "")
    with d.client() as c:
        status = c.status()
    assert status.stack_sampler == "dumps", (status.stack_sampler, status.stack_note)
    cfg.write_text('[stacks]\nsampler = "off"\n[alerts]\nwarn_fraction = 0.5\n')
    d.proc.send_signal(signal.SIGHUP)
    poll("the reload", lambda: "reloaded" in d.log)
    line = next(s for s in d.log.splitlines() if "reloaded" in s)
    assert f"reloaded {cfg}: applied alerts.warn_fraction; {KEPT}" in line, line
    with d.client() as c:
        status = c.status()
    assert (status.stack_sampler, status.stack_sampler_note) == \
        ("dumps", "py-spy dumps one after the other while a process grows")
    assert d.proc.poll() is None


# --------------------------------------------------------------------------- one row


@dataclass
class Extended(AgentConfig):
    """The agent's configuration with two more keys, each declared once, as a new one would be."""

    level: float = key("frob.level", Number(0.0, 1.0), 0.5, reload=LIVE, doc="A synthetic live key.",
                       flag=flag("--frob-level", metavar="LEVEL", help="the synthetic level"))
    mode: str = key("frob.mode", Choice("a", "b"), "a", reload=RESTART, doc="A synthetic restart key.")


TABLE = keys_of(Extended)


def test_the_table_is_every_field_declared_with_key() -> None:
    assert len(KEYS) == 61 and len({r.key.file for r in KEYS}) == 61
    assert [r.key.file for r in TABLE[-2:]] == ["frob.level", "frob.mode"]
    assert TABLE[:-2] == KEYS


def test_a_key_added_as_one_field_is_checked_like_the_others() -> None:
    schema = schema_of(TABLE)
    assert validate({"frob": {"level": 0.25, "mode": "b"}}, schema=schema) == {"frob.level": 0.25, "frob.mode": "b"}
    with pytest.raises(ConfigError, match=r"^frob\.level: out of range: 2 \(from 0 to 1\)$"):
        validate({"frob": {"level": 2}}, schema=schema)
    with pytest.raises(ConfigError, match=r"^frob\.mode: expected \"a\" or \"b\", got 'c'$"):
        validate({"frob": {"mode": "c"}}, schema=schema)
    with pytest.raises(ConfigError, match="did you mean 'level'"):
        validate({"frob": {"levl": 1}}, schema=schema)
    with pytest.raises(ConfigError, match="unknown key"):  # not in the daemon's own schema
        validate({"frob": {"level": 0.25}})


def test_a_key_added_as_one_field_has_its_flag_and_merge() -> None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_flags(parser, TABLE)
    flags = vars(parser.parse_args(["--frob-level", "0.75"]))
    assert flags["frob_level"] == 0.75
    with pytest.raises(argparse.ArgumentError, match=r"^argument --frob-level: out of range: 3 \(from 0 to 1\)$"):
        parser.parse_args(["--frob-level", "3"])
    assert "--frob-level LEVEL" in parser.format_help() and "--stack-budget PER_SECOND" in parser.format_help()
    values = validate({"frob": {"level": 0.25, "mode": "b"}}, schema=schema_of(TABLE))
    config = agent_config(values, flags, "/s", cls=Extended)
    assert isinstance(config, Extended) and (config.level, config.mode) == (0.75, "b")  # the flag wins
    assert agent_config(values, {}, "/s", cls=Extended).level == 0.25


def test_a_key_added_as_one_field_is_split_by_its_reload_and_documented() -> None:
    running, new = Extended(socket="/s"), Extended(socket="/s", level=0.1, mode="b")
    assert split_changes(running, new) == (["frob.level"], ["frob.mode"])
    copy_live(running, new)
    assert (running.level, running.mode) == (0.1, "a")  # a restart key is never copied
    table = markdown(TABLE)
    assert "| `frob.level` | number, 0 – 1 | `0.5` | live | `--frob-level LEVEL` | A synthetic live key. |" in table
    assert '| `frob.mode` | `"a"` or `"b"` | `"a"` | restart | — | A synthetic restart key. |' in table
