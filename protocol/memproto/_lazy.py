"""Names a package serves from its submodules, each submodule imported at its first use.

Why: the wire's 45 dataclasses cost about 20 ms to create, most of what a command such as
``memagent ls`` spends importing. Loaded where they are used, ``ls`` creates the ten it
decodes. ``from memproto.records import ProcessInfo`` and ``memproto.frames.Hello`` work as
before (PEP 562: a module's ``__getattr__`` answers names it does not hold yet).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, homes: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module ``__getattr__`` and ``__dir__`` for ``package``, serving each name of
    ``homes`` (name -> module path relative to ``package``, e.g. ``".process"``).

    A name once served is stored in the package, so that later lookups are plain attribute
    reads."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(homes))

    return __getattr__, __dir__
