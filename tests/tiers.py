"""The suite's two tiers: the fast one, which starts no process, and ``e2e``.

``make test-fast`` runs ``pytest -m "not e2e"``: the contributor's loop, seconds on two
cores. ``make test`` (and CI) runs both. A test is ``e2e`` when it

* lives under ``tests/e2e/``,
* uses a fixture that starts processes (:data:`PROCESS_FIXTURES`), or
* says so itself (``@pytest.mark.e2e``, or ``pytestmark = pytest.mark.e2e`` in its module).

The rest must start no process at all, and that is checked rather than trusted: while a
fast-tier test runs, an audit hook (PEP 578, the interpreter's own notice of a fork, a
spawn, an exec or a ``subprocess.Popen``) refuses the start and fails the test with a line
that says how to mark it. An audit hook is no stand-in for a library: it watches what the
code does and changes nothing of what a library does until it refuses.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

#: Fixtures that start a daemon, a target, a compiler, another user's process or a
#: pytest of its own: a test using one is ``e2e`` whatever else it does.
PROCESS_FIXTURES = frozenset({
    "start_daemon", "daemon", "make_target", "build_lib", "lib_dir", "test_user", "pytester", "testdir",
})

#: The interpreter's audit events for a new process (``sys.audit`` table of the Python docs).
PROCESS_EVENTS = frozenset({
    "subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system",
})

E2E_DIR = Path(__file__).resolve().parent / "e2e"

MARKER = (
    "e2e: starts processes (a daemon, targets, CLI subprocesses, tmux, pytester, bundles); "
    "`make test-fast` leaves it out")


class _Guard:
    """Which fast-tier test runs now, and the process starts it tried."""

    def __init__(self) -> None:
        self.test: str | None = None
        self.thread: int | None = None
        self.refused: list[str] = []

    def audit(self, event: str, args: tuple[object, ...]) -> None:
        if self.test is None or event not in PROCESS_EVENTS:
            return
        what = f"{event} {args[0]!r}" if args else event
        self.refused.append(what)
        raise RuntimeError(
            f"{self.test} started a process ({what}) but is not marked e2e: mark it "
            "@pytest.mark.e2e, or use a fixture of tests/tiers.py's PROCESS_FIXTURES")


GUARD = _Guard()
_installed = threading.Lock()
_hooked = False


def install() -> None:
    """Add the audit hook once per interpreter (hooks cannot be removed: it idles when no
    fast-tier test is running)."""
    global _hooked
    with _installed:
        if not _hooked:
            sys.addaudithook(GUARD.audit)
            _hooked = True


def is_e2e(item: pytest.Item) -> bool:
    path = Path(str(item.path)).resolve()
    if E2E_DIR in path.parents:
        return True
    if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    return item.get_closest_marker("e2e") is not None


def mark(items: list[pytest.Item]) -> None:
    for item in items:
        if is_e2e(item) and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e)
