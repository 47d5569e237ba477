"""Subscriptions and what they push: samples, attach/exit/detach, alerts, drops."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import ProtocolError
from ..records.alert import Alert
from ..records.process import ProcessInfo
from ..records.sample import (
    OPTIONAL_SAMPLE_FIELDS,
    SAMPLE_CHECKS,
    SAMPLE_COLUMNS,
    SAMPLE_EXACT,
    SAMPLE_FIELDS,
    ProcessSample,
)
from ..schema import wire
from .session import Frame


@wire
@dataclass(frozen=True, slots=True)
class Subscribe(Frame):
    """Receive sample frames and events until unsubscribed."""

    TYPE: ClassVar[str] = "subscribe"
    id: int


@wire
@dataclass(frozen=True, slots=True)
class Unsubscribe(Frame):
    """Stop receiving sample frames and events."""

    TYPE: ClassVar[str] = "unsubscribe"
    id: int


@wire
@dataclass(frozen=True, slots=True)
class Sample(Frame):
    """One tick: a row per watched process (exited ones too, frozen at their last values)."""

    TYPE: ClassVar[str] = "sample"
    seq: int
    time: float
    interval: float
    fields: list[str]
    rows: list[list[Any]]

    def validate(self) -> None:
        missing = [name for name in SAMPLE_FIELDS if name not in self.fields]
        if missing:
            raise ProtocolError(f"missing column {missing[0]!r}", frame=self.TYPE, field="fields")
        width = len(self.fields)
        where = [(self.fields.index(name), name, kind) for name, kind in SAMPLE_CHECKS.items()
                 if name in self.fields]
        # The rows' shapes (each value's exact type) are a handful per frame: checked once
        # each, a frame of 1000 rows costs a tenth of checking every value (a replay reads
        # hours of them). A shape with a type not listed exactly (a subclass) is checked
        # value by value below, as is every frame with a bad row, for its message.
        exact = [(col, SAMPLE_EXACT[name]) for col, name, _ in where]
        if all(len(shape) == width and all(shape[col] in ok for col, ok in exact)
               for shape in {tuple(map(type, row)) for row in self.rows}):
            return
        for r, row in enumerate(self.rows):
            if len(row) != width:
                raise ProtocolError(
                    f"row has {len(row)} values for {width} columns", frame=self.TYPE, field=f"rows[{r}]"
                )
            for col, name, kind in where:
                value = row[col]
                if not isinstance(value, kind) or (kind is not bool and type(value) is bool):
                    raise ProtocolError(
                        f"column {name!r} has a {type(value).__name__}", frame=self.TYPE, field=f"rows[{r}]"
                    )

    def column_index(self) -> dict[str, int]:
        """Where each of :data:`SAMPLE_COLUMNS` is in this frame's rows (-1: absent, an
        older agent's frame): for a reader that takes the values it needs from each row
        without a record a row (memtop: 1000 processes a tick, or hours of them replayed)."""
        return {name: self.fields.index(name) if name in self.fields else -1 for name in SAMPLE_COLUMNS}

    def records(self) -> list[ProcessSample]:
        """Rows as :class:`ProcessSample`, ignoring columns this version does not know."""
        idx = [self.fields.index(name) for name in SAMPLE_FIELDS]
        extra = [self.fields.index(name) if name in self.fields else -1 for name in OPTIONAL_SAMPLE_FIELDS]
        if all(i >= 0 for i in extra):
            idx += extra
            return [
                ProcessSample(row[idx[0]], float(row[idx[1]]), *(row[i] for i in idx[2:]))  # type: ignore[arg-type]
                for row in self.rows
            ]
        return [
            ProcessSample(
                row[idx[0]], float(row[idx[1]]), *(row[i] for i in idx[2:]),  # type: ignore[arg-type]
                *(row[i] if i >= 0 else None for i in extra),
            )
            for row in self.rows
        ]


@wire
@dataclass(frozen=True, slots=True)
class Attached(Frame):
    """A process was attached (by any client, a rule or a fork followed)."""

    TYPE: ClassVar[str] = "attached"
    process: ProcessInfo


@wire
@dataclass(frozen=True, slots=True)
class Exited(Frame):
    """A watched process exited; its entry stays, frozen, until detached."""

    TYPE: ClassVar[str] = "exited"
    pid: int
    start_time: float
    #: When the agent noticed the exit.
    time: float
    rss_peak_bytes: int


@wire
@dataclass(frozen=True, slots=True)
class Detached(Frame):
    """A watched process was detached."""

    TYPE: ClassVar[str] = "detached"
    pid: int
    start_time: float


@wire
@dataclass(frozen=True, slots=True)
class AlertRaised(Frame):
    """v1.3: an alert fired, changed severity, or resolved."""

    TYPE: ClassVar[str] = "alert"
    alert: Alert


@wire
@dataclass(frozen=True, slots=True)
class Dropped(Frame):
    """Sent before the next sample when this client was too slow: ``count`` is the total
    number of sample frames dropped for it since it connected."""

    TYPE: ClassVar[str] = "dropped"
    count: int
