"""The house rules that import-linter cannot see (``docs/architecture.md``):

- only :mod:`memagent.proc` touches the kernel's and drivers' files: no other module of
  the agent opens, lists or reads links under /proc, /sys or /dev.

Size is not a rule here: ruff's C901 caps each function's complexity (``pyproject.toml``)
and ``make lint`` warns of a module past 600 lines; import cycles are
``test_import_cycles.py``'s.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "agent" / "memagent"
#: Calls that reach files or directories by path.
FILE_CALLS = {"open", "os.open", "os.listdir", "os.readlink", "os.scandir", "os.stat", "os.lstat", "io.open"}
KERNEL_PREFIXES = ("/proc", "/sys", "/dev/kmsg")
#: Deliberate exceptions, each with its reason.
ALLOWED = {
    ("config.py", "open"): "the TOML configuration file, not a kernel file",
    ("cli/main.py", "os.open"): "/dev/null over a closed stdout (| head)",
    ("serve/listen.py", "os.stat"): "the daemon's own socket file and its directories",
    ("serve/listen.py", "os.lstat"): "the daemon's own socket file and its directories",
    ("serve/listen.py", "os.open"): "the daemon's lock file beside its socket (one daemon per path)",
    ("serve/state.py", "os.open"): "the daemon's state directory and its state file (kept across restarts)",
    ("serve/state.py", "os.lstat"): "the state directory's check (not a symbolic link) before it is opened",
    ("serve/record_files.py", "os.open"): "the flight recorder's directory and segments, in the state directory",
    ("serve/record_files.py", "os.scandir"): "the flight recorder's segments (sizes, sequence numbers)",
    ("cli/record_cmd.py", "os.open"): "the file memagent record -o writes (O_EXCL: never over an existing one)",
    ("cli/run_report.py", "os.open"): "the files memagent run --report/--junit write, $GITHUB_STEP_SUMMARY",
    ("cli/admit_cmd.py", "open"): "the run report memagent admit --report reads",
    ("serve/metrics_textfile.py", "os.open"): "the metrics textfile for node_exporter ([metrics] textfile) and its "
                                              "directory (synced after the rename)",
}


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return ""


def _outside_proc() -> list[Path]:
    return [p for p in AGENT.rglob("*.py") if "proc" not in p.relative_to(AGENT).parts[:1]]


def test_only_the_proc_layer_opens_files() -> None:
    found = []
    for path in _outside_proc():
        rel = path.relative_to(AGENT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = _name(node.func)
                if name in FILE_CALLS and (rel, name) not in ALLOWED:
                    found.append(f"{rel}:{node.lineno} {name}()")
    assert not found, "file access outside memagent/proc: " + ", ".join(found)


def test_no_kernel_path_outside_the_proc_layer() -> None:
    found = []
    for path in _outside_proc():
        rel = path.relative_to(AGENT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith(KERNEL_PREFIXES):
                found.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not found, "kernel paths outside memagent/proc: " + ", ".join(found)


def test_the_rules_see_a_violation(tmp_path: Path) -> None:
    """The AST scan above does find an open() of a /proc path (the rule can fail)."""
    tree = ast.parse('with open("/proc/meminfo") as f: pass')
    calls = [_name(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    paths = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    assert "open" in calls and any(str(p).startswith(KERNEL_PREFIXES) for p in paths)

