"""How the pytest plugin finds a ``memagent run`` among its ancestors
(:mod:`memagent.gate.marks`): on this box's own /proc (a real parent named by ``prctl``), and
on /proc trees written for the cases this box cannot make (an unreadable ancestor, a chain
without end)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memagent.gate.marks import GATE_COMM, MAX_ANCESTORS, GateSearch, gate_ancestor
from memagent.proc.procfs import ProcFS

#: A parent that names itself as memagent run does (PR_SET_NAME), then runs a child that walks.
NAMED_PARENT = f"""
import ctypes, subprocess, sys
ctypes.CDLL(None).prctl(15, {GATE_COMM.encode()!r}, 0, 0, 0)
child = "import json, os; from memagent.gate.marks import gate_ancestor; from memagent.proc.procfs import ProcFS; " \\
        "print(json.dumps([os.getppid(), gate_ancestor(ProcFS(), os.getpid()).gate]))"
sys.exit(subprocess.run([sys.executable, "-c", child]).returncode)
"""


@pytest.mark.e2e
def test_a_parent_named_memagent_run_is_found_whatever_the_environment() -> None:
    r = subprocess.run([sys.executable, "-c", NAMED_PARENT], capture_output=True, text=True, timeout=30, env={})
    assert r.returncode == 0, r.stderr
    parent, gate = json.loads(r.stdout)
    assert gate == parent


def test_no_run_above_this_process() -> None:
    assert gate_ancestor(ProcFS(), os.getpid()) == GateSearch()


def _proc(root: Path, pid: int, ppid: int, comm: str = "sh") -> None:
    (root / str(pid)).mkdir()
    fields = " ".join(["S", str(ppid)] + ["0"] * 18 + ["1000"])
    (root / str(pid) / "stat").write_text(f"{pid} ({comm}) {fields}\n")


def test_walks_up_to_the_nearest_run(tmp_path: Path) -> None:
    _proc(tmp_path, 1, 0, "init")
    _proc(tmp_path, 10, 1, GATE_COMM)
    _proc(tmp_path, 20, 10, "env")  # env -i execs in place: the variable is gone, the parent is not
    _proc(tmp_path, 30, 20, "python3")
    assert gate_ancestor(ProcFS(str(tmp_path)), 30) == GateSearch(gate=10)
    assert gate_ancestor(ProcFS(str(tmp_path)), 10) == GateSearch()  # the run itself is not under one


def test_an_unreadable_ancestor_is_unsure_not_absent(tmp_path: Path) -> None:
    """hidepid, a /proc entry the walk cannot read: a run above it would be unseen, so the
    plugin must not take it for "no run" (it then leaves the high-water mark alone)."""
    _proc(tmp_path, 1, 0, "init")
    (tmp_path / "5").mkdir()
    (tmp_path / "5" / "stat").mkdir()  # not a file: unreadable
    _proc(tmp_path, 30, 5, "python3")
    found = gate_ancestor(ProcFS(str(tmp_path)), 30)
    assert found.gate is None and found.unsure is not None and "ancestor PID 5" in found.unsure


def test_a_chain_without_end_is_unsure(tmp_path: Path) -> None:
    _proc(tmp_path, 6, 7)
    _proc(tmp_path, 7, 6)  # a loop no kernel makes: the walk still ends
    _proc(tmp_path, 30, 6, "python3")
    found = gate_ancestor(ProcFS(str(tmp_path)), 30)
    assert found.unsure == f"more than {MAX_ANCESTORS} ancestors"


def test_an_ancestor_that_exits_during_the_walk(tmp_path: Path) -> None:
    """Its PID is gone (the process reparented meanwhile): walked again, then given up as unsure."""
    _proc(tmp_path, 30, 99, "python3")  # 99 does not exist, and the chain never changes here
    found = gate_ancestor(ProcFS(str(tmp_path)), 30)
    assert found.gate is None and found.unsure == "the parent chain kept changing during the walk"
