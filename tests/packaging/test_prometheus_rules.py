"""The Prometheus alert rules (packaging/prometheus) and the Grafana dashboard (packaging/grafana).

promtool (Debian's ``prometheus`` package) checks the rules and runs their unit tests, and
parses every dashboard query (as recording rules). Every metric and label name the rules,
their description templates and the dashboard query is taken from what a real daemon
exports: a daemon with ``--metrics``, a budget that fires, a watched process on a (fake) GPU,
scraped once. A renamed metric or label therefore fails here, not on an operator's fleet.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, Target, free_port, poll, scrape
from fakes.fakenvml import FakeGpuState, GiB, build_fake_nvml, nvml_env

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "packaging" / "prometheus" / "memagent.rules.yml"
RULE_TESTS = ROOT / "packaging" / "prometheus" / "memagent.rules.test.yml"
DASHBOARD = ROOT / "packaging" / "grafana" / "memagent.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian/Ubuntu: apt-get install prometheus)")

#: Series Prometheus makes itself, with their labels (ALERTS also has the alert's own labels).
PROMETHEUS_OWN: dict[str, set[str]] = {
    "up": {"instance", "job"},
    "ALERTS": {"alertname", "alertstate", "severity", "instance", "job"},
}
#: Labels every scraped series gets from Prometheus.
TARGET_LABELS = {"instance", "job"}
#: What the dashboard's Grafana variables stand for, to make its queries plain PromQL.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$instance": ".*"}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_MATCHERS = re.compile(r"\{([^{}]*)\}")
_MATCHER_LABEL = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_IDENT = re.compile(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
             "group_right", "Inf", "inf", "NaN", "nan"}


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression uses. Not a full PromQL parser: strings,
    ranges and label lists are cut out first, then a name followed by ``(`` is a function
    or an aggregation and any other name a metric."""
    labels: set[str] = set()
    text = _STRING.sub('""', expr)
    text = _RANGE.sub("", text)
    for m in _LABEL_LIST.finditer(text):
        labels |= {x.strip() for x in m.group(1).split(",") if x.strip()}
    text = _LABEL_LIST.sub(" ", text)
    for m in _MATCHERS.finditer(text):
        labels |= set(_MATCHER_LABEL.findall(m.group(1)))
    text = _MATCHERS.sub(" ", text)
    metrics = {m.group(1) for m in _IDENT.finditer(text) if not m.group(2) and m.group(1) not in _KEYWORDS}
    return metrics, labels


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric, the label names its ``{…}`` matches on) for each selector with a name."""
    text = _STRING.sub('""', expr)
    return [(m.group(1), set(_MATCHER_LABEL.findall(m.group(2))))
            for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)\s*\{([^{}]*)\}", text)]


def rule_expressions(text: str) -> list[str]:
    """Each rule's ``expr`` (plain or a folded ``>-`` block) from the rules file."""
    out: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"(\s*)expr:\s*(.*)$", line)
        if not m:
            continue
        if m.group(2) not in (">-", ">", "|", "|-"):
            out.append(m.group(2))
            continue
        indent, block = len(m.group(1)), []
        for nxt in lines[i + 1:]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                break
            block.append(nxt.strip())
        out.append(" ".join(block))
    return out


def template_queries(text: str) -> list[str]:
    """The PromQL in the description templates (``printf "…" … | query``, ``query "…"``),
    with ``%q`` as an empty string."""
    found = re.findall(r'(?:printf|query) "((?:[^"\\]|\\.)*)"', text)
    return [q.replace('\\"', '"').replace("%q", '""') for q in found]


def dashboard_targets(dash: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            yield panel["title"], t


def plain_promql(expr: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    return expr


def test_promql_names_sees_metrics_and_labels() -> None:
    """The name finder the checks below rely on."""
    metrics, labels = promql_names(
        'histogram_quantile(0.99, sum by (instance, le) (rate(memagent_tick_duration_seconds_bucket'
        '{instance=~"$instance"}[5m]))) / on (job) group_left () memagent_x{resource!="host"} > bool 1e3')
    assert metrics == {"memagent_tick_duration_seconds_bucket", "memagent_x"}
    assert labels == {"instance", "le", "job", "resource"}
    assert selectors('a{x="}", y!~"z"} + b + c{}') == [("a", {"x", "y"}), ("c", set())]


# --------------------------------------------------------------------------- promtool


@needs_promtool
@pytest.mark.e2e  # runs promtool
def test_promtool_check_rules() -> None:
    r = subprocess.run([str(PROMTOOL), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


@needs_promtool
@pytest.mark.e2e  # runs promtool
def test_promtool_unit_tests_pass() -> None:
    r = subprocess.run([str(PROMTOOL), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                       timeout=60, cwd=RULE_TESTS.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr


def test_every_rule_is_tested_firing_and_not_firing() -> None:
    alerts = re.findall(r"^\s*- alert: (\w+)\s*$", RULES.read_text(), re.M)
    assert len(alerts) >= 6, alerts
    fires: set[str] = set()
    quiet: set[str] = set()
    # Each `- eval_time:` case up to the next one: its alertname, and whether it expects alerts.
    for case in re.split(r"^\s*- eval_time:", RULE_TESTS.read_text(), flags=re.M)[1:]:
        name = re.search(r"alertname: (\w+)", case)
        assert name, case
        (fires if re.search(r"exp_alerts:\s*\n\s*- exp_labels", case) else quiet).add(name.group(1))
    assert set(alerts) <= fires, f"never shown firing: {set(alerts) - fires}"
    assert set(alerts) <= quiet, f"never shown not firing: {set(alerts) - quiet}"


def test_every_rule_has_a_summary_and_description_naming_a_process() -> None:
    text = RULES.read_text()
    rules = re.split(r"^\s*- alert: ", text, flags=re.M)[1:]
    assert rules
    anchors = dict(re.findall(r"annotations: &(\w+)\n((?:\s{10}.*\n)+)", text))
    for rule in rules:
        name = rule.split()[0]
        ref = re.search(r"annotations: \*(\w+)", rule)
        body = anchors[ref.group(1)] if ref else rule
        assert "summary:" in body and "description:" in body, name
        assert "Labels.name" in body or "$labels.name" in body, f"{name}: no process named"


# --------------------------------------------------------------------------- the dashboard


def test_dashboard_parses_and_every_panel_queries() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert 36 <= dash["schemaVersion"] <= 39
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "instance" in variables["instance"]["query"]["query"]
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(panels) >= 8
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    for p in panels:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        exprs = [t.get("expr", "").strip() for t in p.get("targets", [])]
        assert exprs and all(exprs), f"{p['title']}: a panel without a query"
        assert all("$instance" in e for e in exprs), f"{p['title']}: not filtered by the instance variable"
    titles = " ".join(p["title"] for p in panels).lower()
    for what in ("peaks vs capacity", "top peak offenders", "vram", "alerts firing", "watched processes",
                 "tick duration"):
        assert what in titles, what


@needs_promtool
@pytest.mark.e2e  # runs promtool
def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query, as a recording rule (JSON is YAML)."""
    rules = [{"record": f"dashboard:query_{i}", "expr": plain_promql(t["expr"])}
             for i, (_, t) in enumerate(dashboard_targets(json.loads(DASHBOARD.read_text())))]
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    r = subprocess.run([str(PROMTOOL), "check", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(rules)} rules found" in r.stdout


# --------------------------------------------------------------------------- against a real daemon


def exported(text: str) -> dict[str, set[str]]:
    """Metric name -> its label names, from the samples of a text exposition. A process
    family declared with no sample (``memagent_process_leak_eta_seconds`` when nothing
    grows) has the labels every process family has, those of ``memagent_process_rss_bytes``."""
    out: dict[str, set[str]] = {}
    declared = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            declared.add(line.split()[2])
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][\w:]*)(\{.*\})?\s", line)
        assert m, line
        out.setdefault(m.group(1), set()).update(re.findall(r'(\w+)="(?:[^"\\]|\\.)*"', m.group(2) or ""))
    for name in declared - out.keys():
        if name.startswith("memagent_process_"):
            out[name] = set(out.get("memagent_process_rss_bytes", ()))
    return out


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not on PATH: cannot build the fake NVML library (for the GPU series)")
    return build_fake_nvml(tmp_path_factory.mktemp("fake-nvml"))


@pytest.fixture
def scraped(fake_nvml: Path, tmp_path: Path, start_daemon: Callable[..., Daemon],
            make_target: Callable[..., Target]) -> dict[str, set[str]]:
    """One scrape of a daemon with a budget alert firing and a process on a fake GPU."""
    t = make_target()
    gpus = FakeGpuState()
    gpus.add_device(total=80 * GiB, used=2 * GiB, uuid="GPU-5e1f0000-0000-4000-8000-000000000000")
    gpus.add_proc(0, t.pid, 1 * GiB)
    state = tmp_path / "gpu-state"
    gpus.write(state)
    config = tmp_path / "memagent.toml"
    config.write_text('[budgets]\ntiny = "64KiB"\n')
    port = free_port()
    d = start_daemon("--config", str(config), "--interval", "0.1", "--metrics", f"127.0.0.1:{port}",
                     env=nvml_env(fake_nvml, state))
    with d.client() as c:
        c.attach([t.pid], label="tiny")

    def ready() -> dict[str, set[str]] | None:
        status, _, body = scrape(port)
        assert status == 200, body
        names = exported(body)
        # Wait for the figures that take a tick or two: the GPU peak and the budget alert.
        ready = {"memagent_process_vram_peak_bytes", "memagent_alert_firing", "memagent_headroom_ratio"}
        return names if ready <= names.keys() else None

    found: dict[str, set[str]] = poll("a scrape with GPU figures and a firing alert", ready, timeout=10)
    return found


def test_rules_and_dashboard_use_only_exported_names(scraped: dict[str, set[str]]) -> None:
    known = {**scraped, **PROMETHEUS_OWN}
    rules_text = RULES.read_text()
    queries = [(f"rule expr {e[:60]}", e) for e in rule_expressions(rules_text)]
    queries += [(f"rule template {q[:60]}", q) for q in template_queries(rules_text)]
    queries += [(f"panel {title!r}", plain_promql(t["expr"]))
                for title, t in dashboard_targets(json.loads(DASHBOARD.read_text()))]
    assert len(queries) > 30
    used: set[str] = set()
    for where, expr in queries:
        metrics, labels = promql_names(expr)
        assert metrics, f"{where}: no metric found in {expr!r}"
        unknown = metrics - known.keys()
        assert not unknown, f"{where}: not exported by the daemon: {sorted(unknown)}"
        have = set().union(TARGET_LABELS, *(known[m] for m in metrics))
        assert labels <= have, f"{where}: labels {sorted(labels - have)} are on none of {sorted(metrics)}"
        for metric, matched in selectors(expr):
            extra = matched - known[metric] - TARGET_LABELS
            assert not extra, f"{where}: {metric} has no label {sorted(extra)}"
        used |= metrics
    # Everything the rules and dashboard are about is covered by some query.
    for name in ("memagent_headroom_ratio", "memagent_process_rss_peak_bytes", "memagent_process_vram_bytes",
                 "memagent_label_budget_bytes", "memagent_alert_firing", "memagent_tick_duration_seconds_bucket",
                 "memagent_watched_processes", "memagent_process_growth_bytes_per_second",
                 "memagent_process_leak_eta_seconds", "memagent_headroom_resource_info", "up"):
        assert name in used, name
