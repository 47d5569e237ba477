"""The house rules that import-linter cannot see (``docs/architecture.md``):

- two rooms of the agent open files: :mod:`memagent.proc` (the kernel's and drivers'
  files: /proc, /sys, /dev) and :mod:`memagent.store` (the daemon's own: its state
  directory, the flight recorder's segments, the metrics textfile, the socket's lock
  file; the other rooms call its helpers); no other module opens, lists or inspects
  files, and none but ``proc`` names a kernel path.

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
#: The rooms whose work is files: the kernel's (proc) and the daemon's own (store).
FILE_ROOMS = ("proc", "store")
#: Deliberate exceptions outside those rooms, each with its reason.
ALLOWED = {
    ("config/file.py", "open"): "the TOML configuration file, not a kernel file",
    ("cli/main.py", "os.open"): "/dev/null over a closed stdout (| head)",
    ("recordings/writer.py", "os.open"): "the file memagent record -o writes (O_EXCL: never over an existing one)",
    ("gate/outputs.py", "os.open"): "the files memagent run --report/--junit write, $GITHUB_STEP_SUMMARY",
    ("gate/outputs.py", "open"): "the run report memagent admit --report reads",
    ("config/checks.py", "os.stat"): "a configured program ([stacks] py_spy, austin) must be a regular file",
}


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return ""


def _outside(rooms: tuple[str, ...]) -> list[Path]:
    """The agent's modules outside the top-level packages ``rooms``."""
    return [p for p in AGENT.rglob("*.py") if p.relative_to(AGENT).parts[0] not in rooms]


def test_only_the_file_rooms_open_files() -> None:
    found = []
    for path in _outside(FILE_ROOMS):
        rel = path.relative_to(AGENT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = _name(node.func)
                if name in FILE_CALLS and (rel, name) not in ALLOWED:
                    found.append(f"{rel}:{node.lineno} {name}()")
    assert not found, "file access outside memagent/proc and memagent/store: " + ", ".join(found)


def test_no_kernel_path_outside_the_proc_layer() -> None:
    found = []
    for path in _outside(("proc",)):
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

