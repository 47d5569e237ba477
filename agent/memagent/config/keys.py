"""One declaration per configuration key, and the table derived from them.

A key is declared once, on the dataclass field that holds its value
(:mod:`memagent.config.sections`), with :func:`key`: its file key, its check, its
default, whether SIGHUP applies it (:data:`LIVE`) or only a restart (:data:`RESTART`),
its flag if it has one, and a line of doc. Everything else is derived from that
declaration by walking the fields (:func:`keys_of`): the schema the file and the flags
are checked against (:mod:`memagent.config.schema`), the daemon's flags
(:mod:`memagent.config.flags`), the file-and-flags merge and the reload split
(:mod:`memagent.config.source`, :mod:`memagent.config.reload`), and the key table of
``docs/configuration.md`` (:mod:`memagent.config.doc`). A field declared without
:func:`key` (``history_step``, ``stacks.burst``) is no key: not in the file, never
reloaded.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from .checks import Check

T = TypeVar("T")


class Reload(Enum):
    """What a SIGHUP does with a changed key."""

    #: Applied to the running parts at once.
    LIVE = "live"
    #: Bound, paced, sized, opened or found at start: the running value is kept and the
    #: reload says a restart is needed.
    RESTART = "restart"


LIVE, RESTART = Reload.LIVE, Reload.RESTART


@dataclass(frozen=True)
class Flag:
    """The daemon's command-line flag of a key (``memagent daemon --help`` shows ``help``)."""

    #: The flag and its aliases: ``("--auto-label", "--label")``.
    names: tuple[str, ...]
    help: str
    metavar: str | None = None
    #: Repeatable: each use gives one item of the key's list (the flags replace the file's list).
    repeat: bool = False
    #: ``--no-gpu``: given, it sets the (boolean) key to false.
    switch_off: bool = False
    #: Shown by argparse as ``{austin,dumps,off}``.
    choices: tuple[str, ...] | None = None
    #: The flag's text goes through the key's check (False: taken as written, as ``--auto`` always was).
    checked: bool = True

    @property
    def dest(self) -> str:
        """The argparse destination, the name the flag's value has in ``flags``."""
        return self.names[0].removeprefix("--").replace("-", "_")


def flag(*names: str, help: str, metavar: str | None = None, repeat: bool = False, switch_off: bool = False,
         choices: tuple[str, ...] | None = None, checked: bool = True) -> Flag:
    """A :class:`Flag` (shorter to write in a field's declaration)."""
    return Flag(names, help, metavar, repeat, switch_off, choices, checked)


@dataclass(frozen=True)
class Key:
    """A configuration key: everything about it, in one place."""

    #: ``interval``, ``stacks.sampler``: the file's name of it (``section.name`` for a table's key).
    file: str
    check: Check
    default: Any
    reload: Reload
    #: One line for the doc table.
    doc: str
    flag: Flag | None = None
    #: The default as the doc table shows it, when its value does not say it (derived, or None's meaning).
    shown_default: str | None = None

    @property
    def section(self) -> str | None:
        """The file's table holding the key (``stacks``), None for a top-level key."""
        section, dot, _ = self.file.partition(".")
        return section if dot else None

    @property
    def name(self) -> str:
        """The key's name in its table (``sampler``), or at the top level."""
        return self.file.rpartition(".")[2]


def key(file: str, check: Check, default: T, *, reload: Reload, doc: str, flag: Flag | None = None,
        shown_default: str | None = None) -> T:
    """A dataclass field (typed as its value) that is the configuration key ``file``:
    ``sampler: str = key("stacks.sampler", Choice("austin", "dumps", "off"), "austin",
    reload=RESTART, doc=...)``. A list or dict default is copied for each instance."""
    meta = {"key": Key(file, check, default, reload, doc, flag, shown_default)}
    if isinstance(default, list | dict):
        made: T = dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
        return made
    plain: T = dataclasses.field(default=default, metadata=meta)
    return plain


@dataclass(frozen=True)
class Row:
    """A key and where its value is: the attribute path from the agent's configuration
    (``("stacks", "sampler")``, ``("headroom", "host_capacity")``)."""

    key: Key
    path: tuple[str, ...]

    @property
    def attribute(self) -> str:
        return ".".join(self.path)

    def get(self, config: object) -> Any:
        for name in self.path:
            config = getattr(config, name)
        return config

    def set(self, config: object, value: Any) -> None:
        for name in self.path[:-1]:
            config = getattr(config, name)
        setattr(config, self.path[-1], value)


#: The table: every key, in the order of its fields (sections where their field is).
Table = tuple[Row, ...]


def keys_of(cls: type, prefix: tuple[str, ...] = ()) -> Table:
    """The keys declared on the dataclass ``cls`` and on the section dataclasses it holds
    (fields whose type is a dataclass with keys), depth first, in field order."""
    rows: list[Row] = []
    for f in dataclasses.fields(cls):
        declared = f.metadata.get("key")
        if isinstance(declared, Key):
            rows.append(Row(declared, (*prefix, f.name)))
        elif f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
            rows.extend(keys_of(f.default_factory, (*prefix, f.name)))  # type: ignore[arg-type]
    return tuple(rows)


def live_fields(section: object) -> list[str]:
    """The fields of the dataclass instance ``section`` (its own, not its sections') that
    are live keys: what a reload copies into the running object."""
    return [f.name for f in dataclasses.fields(section)  # type: ignore[arg-type]
            if isinstance(f.metadata.get("key"), Key) and f.metadata["key"].reload is LIVE]


def copy_live(running: object, new: object) -> None:
    """Copy the live keys of one section (``new.stacks`` into ``running.stacks``), in place:
    every part holding the running object sees them. A restart key is never copied."""
    for name in live_fields(running):
        setattr(running, name, getattr(new, name))
