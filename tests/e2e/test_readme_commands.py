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
