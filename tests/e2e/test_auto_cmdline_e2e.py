"""``auto_cmdline``, end to end: real Python processes started with the command lines the
patterns name, a real daemon that auto-attaches them under labels rendered from the
``auto_label`` template (regex groups, ``{comm}``), and the patterns it refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Daemon, memagent_cli, poll

from memagent.config.auto import MAX_CMDLINE

SLEEPER = "import time\ntime.sleep(300)\n"
Spawn = Callable[..., "subprocess.Popen[bytes]"]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start a process (killed at the end)."""
    procs: list[subprocess.Popen[bytes]] = []

    def run(*argv: str, cwd: Path | None = None) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(argv, cwd=cwd)
        procs.append(p)
        return p

    yield run
    for p in procs:
        p.kill()
        p.wait()


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    """``serve_bert.py``, ``serve_llama.py``, ``other.py`` and ``serve.py``: each sleeps."""
    where = tmp_path / "x"
    where.mkdir()
    for name in ("serve_bert.py", "serve_llama.py", "other.py", "serve.py"):
        (where / name).write_text(SLEEPER)
    return where


def ls(d: Daemon) -> dict[int, dict[str, object]]:
    r = memagent_cli("ls", "--json", "--socket", d.socket)
    assert r.returncode == 0, r
    return {p["pid"]: p for p in json.loads(r.stdout)}


def having(d: Daemon, what: str, *pids: int) -> dict[int, dict[str, object]]:
    """``ls`` once it lists every one of ``pids``."""
    return dict(poll(what, lambda: (w := ls(d)).keys() >= set(pids) and w))


def daemon(start_daemon: Callable[..., Daemon], *args: str) -> Daemon:
    return start_daemon("--interval", "0.1", "--no-netlink", "--no-stacks", *args)


def test_models_named_by_a_regex_group(start_daemon: Callable[..., Daemon], spawn: Spawn, scripts: Path) -> None:
    d = daemon(start_daemon, "--auto-cmdline", r"re:serve_(?P<model>\w+)\.py", "--auto-label", "{model}")
    bert = spawn(sys.executable, str(scripts / "serve_bert.py"))
    llama = spawn(sys.executable, str(scripts / "serve_llama.py"), "--port", "1")
    other = spawn(sys.executable, str(scripts / "other.py"))
    got = having(d, "both models attached", bert.pid, llama.pid)
    assert (got[bert.pid]["label"], got[llama.pid]["label"]) == ("bert", "llama")
    assert other.pid not in got
    # A later scan still leaves it alone, and a model started later is found too.
    mistral = spawn(sys.executable, str(scripts / "serve_llama.py"), "mistral")
    poll("a later model attached", lambda: mistral.pid in ls(d))
    assert other.pid not in ls(d)


def test_a_glob_from_an_argument_and_the_group_as_the_default_label(
    start_daemon: Callable[..., Daemon], spawn: Spawn, scripts: Path
) -> None:
    """``serve.py*`` names the arguments from one of them on: ``python3 serve.py --port 1``
    matches, ``python3 /…/x/serve.py`` does not (its argument starts with the directory);
    ``*serve_bert*`` matches anywhere. No template: a glob gives no label, a regex its
    first group."""
    d = daemon(start_daemon, "--auto-cmdline", "serve.py*", "--auto-cmdline", "*serve_bert*",
               "--auto-cmdline", r"re:serve_(ll\w+)\.py")
    here = spawn(sys.executable, "serve.py", "--port", "1", cwd=scripts)
    there = spawn(sys.executable, str(scripts / "serve.py"))
    bert = spawn(sys.executable, str(scripts / "serve_bert.py"))
    llama = spawn(sys.executable, str(scripts / "serve_llama.py"))
    got = having(d, "three attached", here.pid, bert.pid, llama.pid)
    assert (got[here.pid]["label"], got[bert.pid]["label"], got[llama.pid]["label"]) == (None, None, "llama")
    assert there.pid not in ls(d)


def test_a_placeholder_without_a_value_gives_the_comm_and_a_bad_label_falls_back(
    start_daemon: Callable[..., Daemon], spawn: Spawn, scripts: Path
) -> None:
    """Outside a container ``{container}`` has no value: the comm stands in. A regex group
    that makes a label breaking the label rule (200 characters) gives the comm too, logged."""
    d = daemon(start_daemon, "--auto-cmdline", r"re:serve_(\w+)\.py (\S*)", "--auto-label", "{container}:{2}")
    plain = spawn(sys.executable, str(scripts / "serve_bert.py"), "tag")
    long = spawn(sys.executable, str(scripts / "serve_llama.py"), "y" * 200)
    got = having(d, "both attached", plain.pid, long.pid)
    comm = str(got[plain.pid]["name"])
    assert got[plain.pid]["label"] == f"{comm}:tag"
    assert got[long.pid]["label"] == comm
    poll("the fallback logged", lambda: any("labelled by its name instead" in line for line in d.lines))


def test_a_long_command_line_is_matched_on_its_first_kib(
    start_daemon: Callable[..., Daemon], spawn: Spawn, scripts: Path
) -> None:
    d = daemon(start_daemon, "--auto-cmdline", r"re:--model=(\w+)")
    pad = "p" * 200
    early = spawn(sys.executable, str(scripts / "other.py"), "--model=early", *[pad] * 20)  # ~4 KiB
    late = spawn(sys.executable, str(scripts / "other.py"), *[pad] * 6, "--model=late")  # past the first KiB
    assert len(" ".join([sys.executable, str(scripts / "other.py"), *[pad] * 6])) > MAX_CMDLINE
    got = having(d, "the early one attached", early.pid)
    assert got[early.pid]["label"] == "early"
    # Scans went on past the late one (a process started after it was attached first).
    marker = spawn(sys.executable, str(scripts / "other.py"), "--model=marker")
    poll("a later one attached", lambda: marker.pid in ls(d))
    assert late.pid not in ls(d)


@pytest.mark.parametrize(("args", "says"), [
    (["--auto-cmdline", "re:serve_(\\w+"],
     "argument --auto-cmdline: 're:serve_(\\\\w+': not a valid regular expression"),
    (["--auto-cmdline", "re:(a+)+x"], "a repeat inside a repeat"),
    (["--auto-cmdline", "re:\\w+\\w+\\w+\\.py"], "too slow"),
    (["--auto-cmdline", "re:" + "a" * 600], "at most 512 characters"),
    (["--label", "{model"], "argument --auto-label/--label: '{model': not a label template"),
    (["--auto-label", "{comm!r}"], "a placeholder takes no conversion or format"),
    (["--auto-cmdline", "re:serve_(?P<model>\\w+)", "--label", "{modle}"],
     "auto_label: {modle} is not a placeholder"),
])
def test_bad_patterns_and_templates_are_refused_in_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    r = memagent_cli("daemon", "--socket", str(tmp_path / "d.sock"), *args)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stderr
    assert not (tmp_path / "d.sock").exists()


@pytest.mark.parametrize(("text", "says"), [
    ('auto_cmdline = ["re:serve_(\\\\w+"]', ":1: auto_cmdline: 're:serve_(\\\\w+': not a valid regular expression"),
    ('auto_cmdline = ["re:(.*)*"]', ":1: auto_cmdline: 're:(.*)*': a repeat inside a repeat"),
    ('auto_cmdline = "re:(x)"\nauto_label = "{2}"', ":2: auto_label: {2} is not a placeholder"),
    ('auto_label = "{container"', ":1: auto_label: '{container': not a label template"),
    ("auto_cmdline = [1]", ":1: auto_cmdline: expected a string"),
])
def test_check_config_refuses_them_naming_the_key(tmp_path: Path, text: str, says: str) -> None:
    cfg = tmp_path / "m.toml"
    cfg.write_text(text + "\n")
    r = memagent_cli("check-config", str(cfg))
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stderr


def test_check_config_takes_a_template_whose_groups_come_from_the_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "m.toml"
    cfg.write_text('auto_label = "{model}"\nauto_cmdline = ["re:serve_(?P<model>\\\\w+)\\\\.py", "*train.py*"]\n')
    assert memagent_cli("check-config", str(cfg)).returncode == 0
    cfg.write_text('auto_label = "{model}"\n')  # the patterns may come from --auto-cmdline
    assert memagent_cli("check-config", str(cfg)).returncode == 0
