"""No import cycles among our modules (``docs/architecture.md``, "No import cycles").

import-linter checks the layers (``pyproject.toml``), but only between the packages its
contracts name, and it cannot see a cycle inside one layer (``cli/main`` → ``cli/x`` →
``cli/main``) or inside memtop. This test builds the whole graph of
``protocol/memproto``, ``agent/memagent`` and ``tui/memtop`` from the source with
:mod:`ast` and fails on every strongly connected component of more than one module.

What counts as an edge, and why:

- **Every import statement**, wherever it is: at module level, inside a function (a lazy
  import, made to break a cycle at run time or to keep a start fast) and under
  ``if TYPE_CHECKING:``. Neither of the last two is a cycle Python trips on, but both are
  a design cycle: the two modules know each other, cannot be read, tested or layered one
  without the other, and a lazy import that hides a cycle is one refactoring away from an
  ``ImportError`` at start.
- **Module to module.** ``from memagent.cli import install`` is an edge to
  ``memagent.cli.install`` when that is a module, else to ``memagent.cli`` (its
  ``__init__``, which re-exports the name: it is a module like any other).
  ``import a.b.c`` is an edge to ``a.b.c`` only, not to the ``a`` and ``a.b``
  packages whose ``__init__`` Python runs on the way: a package's ``__init__`` that
  imports its own submodules would otherwise make every submodule that imports a
  sibling a cycle, which it is not.
- Imports of other packages (the standard library, msgpack, textual) are not edges.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Each of our packages and the directory it is in.
PACKAGES = {"memproto": ROOT / "protocol", "memagent": ROOT / "agent", "memtop": ROOT / "tui"}


@dataclass(frozen=True)
class Edge:
    """One import: ``source`` imports ``target`` at ``place`` (``memagent/agent.py:12``)."""

    source: str
    target: str
    place: str


def module_files(packages: Mapping[str, Path]) -> dict[str, Path]:
    """Every module of the packages by its dotted name (a package by its ``__init__``)."""
    modules: dict[str, Path] = {}
    for package, parent in packages.items():
        for path in sorted((parent / package).rglob("*.py")):
            parts = path.relative_to(parent).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _resolve(name: str, known: set[str]) -> str | None:
    """The deepest of our modules that ``name`` is or lies in (``a.b.C`` → ``a.b``)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _imported(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> Iterator[str]:
    """The modules of ours one import statement of ``module`` reaches."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            target = _resolve(alias.name, known)
            if target is not None:
                yield target
        return
    base = node.module or ""
    if node.level:
        # A relative import counts from the module's package: its own name when it is an
        # __init__, its parent's otherwise; each further dot goes one package up.
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        target = submodule if submodule in known else _resolve(base, known)
        if target is not None:
            yield target


def import_edges(packages: Mapping[str, Path]) -> list[Edge]:
    """Every import among the packages' modules, lazy and ``TYPE_CHECKING`` ones included."""
    modules = module_files(packages)
    known = set(modules)
    edges = []
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _imported(module, is_package, node, known):
                    if target != module:
                        where = path.relative_to(packages[module.partition(".")[0]]).as_posix()
                        edges.append(Edge(module, target, f"{where}:{node.lineno}"))
    return edges


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The graph's strongly connected components (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        # Each frame: a node and the iterator over its successors still to visit.
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def _shortest_path(graph: Mapping[str, Iterable[str]], start: str, goal: str, within: set[str]) -> list[str]:
    """The shortest path from ``start`` to ``goal`` through ``within`` (breadth first)."""
    came_from: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            break
        for successor in sorted(graph.get(node, ())):
            if successor in within and successor not in came_from:
                came_from[successor] = node
                queue.append(successor)
    path = [goal]
    while (previous := came_from[path[-1]]) is not None:
        path.append(previous)
    return path[::-1]


def import_cycles(edges: Iterable[Edge]) -> list[str]:
    """Each cycle, readable: ``a → b → a  (a.py:3 imports b, b.py:9 imports a)``.

    A component can hold many cycles; this lists, for each import inside it not yet in a
    listed cycle, the shortest cycle through that import, so every import that takes part
    in a cycle appears in one (the one to remove is among them) and the list stays short.
    """
    graph: dict[str, set[str]] = {}
    where: dict[tuple[str, str], Edge] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        where.setdefault((edge.source, edge.target), edge)
    cycles = []
    for component in strongly_connected(graph):
        members = set(component)
        if len(members) < 2:
            continue
        covered: set[tuple[str, str]] = set()
        for source in component:
            for target in sorted(graph[source] & members):
                if (source, target) in covered:
                    continue
                path = [source, *_shortest_path(graph, target, source, members)]
                steps = list(pairwise(path))
                covered.update(steps)
                places = ", ".join(where[step].place for step in steps)
                cycles.append(f"{' → '.join(path)}  ({places})")
    return cycles


def test_no_import_cycles() -> None:
    cycles = import_cycles(import_edges(PACKAGES))
    assert not cycles, "import cycles (break each at one of its imports):\n" + "\n".join(cycles)


def test_the_whole_tree_is_seen() -> None:
    """The scan finds our modules and their imports (an empty graph would pass vacuously)."""
    edges = import_edges(PACKAGES)
    sources = {edge.source for edge in edges}
    assert {"memproto.codec", "memagent.agent", "memtop.app"} <= sources
    assert any(edge.source == "memagent.agent" and edge.target.startswith("memagent.core") for edge in edges)


def _tree(tmp_path: Path, files: Mapping[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {"pkg": tmp_path}


def test_a_cycle_is_found(tmp_path: Path) -> None:
    """Two modules that import each other, one of them lazily inside a function."""
    packages = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import helper\n",
        "pkg/b.py": "def helper() -> None:\n    from . import a\n",
    })
    assert import_cycles(import_edges(packages)) == ["pkg.a → pkg.b → pkg.a  (pkg/a.py:1, pkg/b.py:2)"]


def test_a_cycle_through_type_checking_and_a_package_is_found(tmp_path: Path) -> None:
    """A cycle of three: a ``TYPE_CHECKING`` import, a relative one and a package's re-export."""
    packages = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "from .c import C\n",
        "pkg/sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\nclass C: ...\n",
        "pkg/a.py": "from .sub import C\n",
    })
    assert import_cycles(import_edges(packages)) == [
        "pkg.a → pkg.sub → pkg.sub.c → pkg.a  (pkg/a.py:1, pkg/sub/__init__.py:1, pkg/sub/c.py:3)",
    ]


def test_an_acyclic_tree_passes(tmp_path: Path) -> None:
    """Layers that import downwards only, a package importing its own submodule, outside packages."""
    packages = _tree(tmp_path, {
        "pkg/__init__.py": "from pkg import low\n",
        "pkg/low.py": "import os\nimport msgpack\n",
        "pkg/mid.py": "import pkg.low\nfrom pkg.low import os\n",
        "pkg/high.py": "def run() -> None:\n    from .mid import low\n",
    })
    edges = import_edges(packages)
    assert {(edge.source, edge.target) for edge in edges} == {
        ("pkg", "pkg.low"), ("pkg.mid", "pkg.low"), ("pkg.high", "pkg.mid"),
    }
    assert import_cycles(edges) == []
