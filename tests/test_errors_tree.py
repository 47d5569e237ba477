"""Every exception class of ours derives from one of the documented roots.

``docs/architecture.md`` ("Errors") names three roots, one per side of the wire: a caller
catches its side's root (or a branch) and nothing else, which only holds if no error of
ours stands beside them. This test imports every module of ``memproto``, ``memagent`` and
``memtop`` and checks each exception class defined there; the few that are deliberately
outside the tree are listed in :data:`OUTSIDE`, each with its reason.
"""

from __future__ import annotations

import importlib
import inspect

from test_import_cycles import PACKAGES, module_files

from memagent.errors import MemagentError
from memproto.client_side import ClientError
from memproto.errors import ProtocolError

#: The roots: the agent's, the wire's (and a recording's), a client's.
ROOTS: tuple[type[BaseException], ...] = (MemagentError, ProtocolError, ClientError)
#: Exceptions deliberately under none of the roots, by ``module.QualifiedName``, with why.
OUTSIDE = {
    "memagent.proc.netlink._Refused": "control flow private to the module: open_source turns it into a reason "
                                      "string, it never leaves netlink.py",
}
#: Modules that run something when imported (``python -m memagent.cli``), not imported here.
NOT_IMPORTED = {"memagent.cli.__main__"}


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in sorted(module_files(PACKAGES)):
        if name in NOT_IMPORTED:
            continue
        module = importlib.import_module(name)
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == name:
                found[f"{name}.{value.__qualname__}"] = value
    return found


def test_every_exception_is_under_a_root() -> None:
    stray = [
        f"{name}({', '.join(base.__name__ for base in cls.__bases__)})"
        for name, cls in _exception_classes().items()
        if not issubclass(cls, ROOTS) and name not in OUTSIDE
    ]
    assert not stray, (
        "exceptions under none of MemagentError, ProtocolError, ClientError (derive from one, or list it in "
        "OUTSIDE with its reason): " + ", ".join(stray)
    )


def test_the_outside_list_is_current() -> None:
    """Each exception listed as outside the tree still exists and is still outside it."""
    classes = _exception_classes()
    assert set(OUTSIDE) <= set(classes), set(OUTSIDE) - set(classes)
    assert not [name for name in OUTSIDE if issubclass(classes[name], ROOTS)]


def test_the_walk_sees_the_tree() -> None:
    """The walk finds errors of all three packages (an empty walk would pass vacuously)."""
    classes = _exception_classes()
    assert {"memagent.errors.NoSuchProcess", "memproto.errors.RecordingError",
            "memproto.client_side.DaemonNotRunning", "memproto.codec.UnknownFrameType"} <= set(classes)
