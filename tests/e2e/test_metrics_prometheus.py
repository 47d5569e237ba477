"""A real Prometheus scrapes a real daemon (issue 16): what its HTTP API then answers
for Σ peaks and a watched process's peak is what ``memagent status --json`` and
``ls --json`` say. Debian's ``prometheus`` package provides the server; ``.ci/run``
installs it where it can, and without it this test says so and skips."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, Target, free_port, memagent_cli, poll

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (Debian/Ubuntu: "
                                                           "apt-get install prometheus; .ci/run does as root)")
MiB = 1024 * 1024


def cli_json(d: Daemon, command: str) -> Any:
    out = memagent_cli("--socket", d.socket, command, "--json")
    assert out.returncode in (0, 4, 5), out.stderr
    return json.loads(out.stdout)


def query(port: int, promql: str) -> dict[str, float]:
    """An instant query: each series's labels (as text) -> its value; {} until there is one."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            reply = json.load(r)
    except OSError:  # not answering yet
        return {}
    assert reply["status"] == "success", reply
    return {json.dumps(s["metric"], sort_keys=True): float(s["value"][1]) for s in reply["data"]["result"]}


def one(values: dict[str, float]) -> float | None:
    return next(iter(values.values())) if len(values) == 1 else None


def test_prometheus_sees_what_status_and_ls_say(tmp_path: Path, start_daemon: Callable[..., Daemon],
                                                make_target: Callable[..., Target]) -> None:
    port = free_port()
    d = start_daemon("--interval", "0.1", "--metrics", f"127.0.0.1:{port}")
    t = make_target()
    t.do("alloc 32")  # then it holds still: the figures stay put between a scrape and the CLI
    assert memagent_cli("--socket", d.socket, "attach", str(t.pid)).returncode == 0
    web = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        f"scrape_configs:\n  - job_name: memagent\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
    log = (tmp_path / "prometheus.log").open("w")
    server = subprocess.Popen(
        [str(PROMETHEUS), f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{web}", "--log.level=warn"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        peak_query = f'memagent_process_rss_peak_bytes{{pid="{t.pid}"}}'

        def agree() -> tuple[float, float] | None:
            sum_peaks = one(query(web, 'memagent_headroom_sum_peaks_bytes{resource="host"}'))
            peak = one(query(web, peak_query))
            host = next(h for h in cli_json(d, "status")["headroom"] if h["resource"] == "host")
            proc = next(p for p in cli_json(d, "ls") if p["pid"] == t.pid)
            if sum_peaks == host["sum_peaks_bytes"] and peak == proc["rss_peak_bytes"] >= 32 * MiB:
                return sum_peaks, peak
            return None

        sum_peaks, _ = poll("Prometheus's figures equal to status --json and ls --json", agree, timeout=25)
        assert sum_peaks > 0
        up = query(web, 'up{job="memagent"}')
        assert list(up.values()) == [1.0]
        # Every family reached Prometheus's storage, the OpenMetrics kinds included.
        for name in ("memagent_tick_duration_seconds_count", "memagent_stack_dumps_total", "memagent_build_info",
                     "memagent_watched_processes", "memagent_headroom_warn_fraction"):
            assert query(web, name), name
    finally:
        server.terminate()
        server.wait(15)
        log.close()
    assert server.returncode == 0, (tmp_path / "prometheus.log").read_text()[-2000:]
