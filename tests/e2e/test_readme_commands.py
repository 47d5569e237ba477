"""The README's commands, run exactly as printed against a real daemon (issue 28: its
`jq` example failed on jq 1.6, where `label` is a keyword)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Daemon, Target

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_line(starting: str) -> str:
    """The README's command line that starts with ``starting`` (its trailing comment cut)."""
    for line in README.read_text().splitlines():
        if line.startswith(starting):
            return re.sub(r"\s{2,}#.*$", "", line)
    raise AssertionError(f"no line of README.md starts with {starting!r}")


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed")
def test_the_jq_example_runs_as_printed(daemon: Daemon, make_target: Callable[..., Target], tmp_path: Path) -> None:
    line = _readme_line("memagent ls --json | jq")
    t = make_target()
    with daemon.client() as c:
        c.attach([t.pid], label="resnet")
    bin_dir = tmp_path / "bin"  # `memagent` on PATH as a user has it: this interpreter's package
    bin_dir.mkdir()
    shim = bin_dir / "memagent"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m memagent.cli \"$@\"\n")
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MEMAGENT_SOCKET": daemon.socket}
    r = subprocess.run(["sh", "-c", line], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)
    assert row["pid"] == t.pid and row["label"] == "resnet" and row["rss_peak_bytes"] > 0
    assert set(row) == {"pid", "label", "rss_peak_bytes", "vram_peak_bytes"}


def _day_to_day() -> list[str]:
    """The ``memagent`` lines of the README's "Day to day" block, their comments cut."""
    text = README.read_text()
    block = text[text.index("## Day to day"):]
    block = block[block.index("```sh\n") + 6:block.index("```\n", block.index("```sh\n") + 6)]
    lines = [re.sub(r"\s{2,}#.*$", "", line) for line in block.splitlines()]
    return [line for line in lines if line.startswith("memagent ") and not line.startswith("memagent daemon")]


def test_the_day_to_day_commands_run_as_printed(start_daemon: Callable[..., Daemon],
                                                make_target: Callable[..., Target], tmp_path: Path) -> None:
    """Each ``memagent`` line of "Day to day" against a real daemon (its flight recorder
    on), as printed but for three things a test must choose: the PID (4242 there), the
    configuration file checked (the example one), and ``record``'s duration (2 s, not 600).
    Every one exits 0 (``status``: no alert fires)."""
    lines = _day_to_day()
    assert len(lines) >= 12, lines
    d = start_daemon("--interval", "0.2", "--state-dir", str(tmp_path / "state"))
    t = make_target()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "memagent"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m memagent.cli \"$@\"\n")
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MEMAGENT_SOCKET": d.socket}
    example = Path(__file__).resolve().parents[2] / "packaging" / "memagent.toml"
    order = sorted(lines, key=lambda x: x.startswith("memagent detach"))  # detach last: the others need it watched
    for line in order:
        if "| jq" in line and shutil.which("jq") is None:
            continue
        command = (line.replace("4242", str(t.pid)).replace("/etc/memagent/memagent.toml", str(example))
                   .replace("--duration 600", "--duration 2"))
        r = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
        assert r.returncode == 0, (line, r.stdout[-500:], r.stderr[-500:])
    assert (tmp_path / "run.mrec").stat().st_size > 0 and (tmp_path / "peaks.html").stat().st_size > 0
