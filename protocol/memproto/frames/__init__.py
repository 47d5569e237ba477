"""Every frame of protocol v1, as frozen dataclasses. ``docs/protocol.md`` is their prose twin.

Frame classes carry their wire tag in ``TYPE``. Requests (client to server) carry an
``id`` that the server's reply repeats. Events are pushed by the server to subscribers.
The records frames carry (processes, alerts, stacks, the sample row) are declared in
:mod:`memproto.records` and served here too, so one import gives a peer the whole wire.

Each request is a module with its reply (``attaching``: ``Attach`` and ``AttachOk``),
imported at the first use of one of its names (see :mod:`memproto._lazy`): a command
creates the classes it sends and decodes, not all 45. :data:`FRAMES` is the index of
where each frame lives; :data:`FRAME_TYPES` looks a tag up in it and imports its module
then.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import records
from .._lazy import lazy_names

if TYPE_CHECKING:
    from .attaching import (
        Attach as Attach,
    )
    from .attaching import (
        AttachOk as AttachOk,
    )
    from .detaching import (
        Detach as Detach,
    )
    from .detaching import (
        DetachOk as DetachOk,
    )
    from .events import (
        AlertRaised as AlertRaised,
    )
    from .events import (
        Attached as Attached,
    )
    from .events import (
        Detached as Detached,
    )
    from .events import (
        Dropped as Dropped,
    )
    from .events import (
        Exited as Exited,
    )
    from .events import (
        Sample as Sample,
    )
    from .events import (
        Subscribe as Subscribe,
    )
    from .events import (
        Unsubscribe as Unsubscribe,
    )
    from .history import (
        History as History,
    )
    from .history import (
        HistoryOk as HistoryOk,
    )
    from .listing import (
        ListOk as ListOk,
    )
    from .listing import (
        ListProcesses as ListProcesses,
    )
    from .peaks import (
        ResetPeaks as ResetPeaks,
    )
    from .peaks import (
        ResetPeaksOk as ResetPeaksOk,
    )
    from .session import (
        Ack as Ack,
    )
    from .session import (
        Error as Error,
    )
    from .session import (
        Frame as Frame,
    )
    from .session import (
        Hello as Hello,
    )
    from .stacks import (
        Stack as Stack,
    )
    from .stacks import (
        StackOk as StackOk,
    )
    from .stacks import (
        StackStateChanged as StackStateChanged,
    )
    from .status import (
        Status as Status,
    )
    from .status import (
        StatusOk as StatusOk,
    )


class FrameEntry(NamedTuple):
    """Where one frame lives: its wire tag, its class's name and module, and its role."""

    tag: str
    name: str
    module: str
    #: "hello", "request", "reply" or "event".
    role: str


#: Every frame of the protocol: requests, replies and events each in their order in
#: docs/protocol.md. A test checks each entry against its class's ``TYPE``.
FRAMES: tuple[FrameEntry, ...] = (
    FrameEntry("hello", "Hello", ".session", "hello"),
    FrameEntry("attach", "Attach", ".attaching", "request"),
    FrameEntry("detach", "Detach", ".detaching", "request"),
    FrameEntry("reset_peaks", "ResetPeaks", ".peaks", "request"),
    FrameEntry("list", "ListProcesses", ".listing", "request"),
    FrameEntry("subscribe", "Subscribe", ".events", "request"),
    FrameEntry("unsubscribe", "Unsubscribe", ".events", "request"),
    FrameEntry("history", "History", ".history", "request"),
    FrameEntry("status", "Status", ".status", "request"),
    FrameEntry("stack", "Stack", ".stacks", "request"),
    FrameEntry("attach_ok", "AttachOk", ".attaching", "reply"),
    FrameEntry("detach_ok", "DetachOk", ".detaching", "reply"),
    FrameEntry("reset_peaks_ok", "ResetPeaksOk", ".peaks", "reply"),
    FrameEntry("list_ok", "ListOk", ".listing", "reply"),
    FrameEntry("history_ok", "HistoryOk", ".history", "reply"),
    FrameEntry("status_ok", "StatusOk", ".status", "reply"),
    FrameEntry("stack_ok", "StackOk", ".stacks", "reply"),
    FrameEntry("ack", "Ack", ".session", "reply"),
    FrameEntry("error", "Error", ".session", "reply"),
    FrameEntry("sample", "Sample", ".events", "event"),
    FrameEntry("attached", "Attached", ".events", "event"),
    FrameEntry("exited", "Exited", ".events", "event"),
    FrameEntry("detached", "Detached", ".events", "event"),
    FrameEntry("dropped", "Dropped", ".events", "event"),
    FrameEntry("stack_state", "StackStateChanged", ".stacks", "event"),
    FrameEntry("alert", "AlertRaised", ".events", "event"),
)
_BY_TAG: dict[str, FrameEntry] = {entry.tag: entry for entry in FRAMES}


class FrameTypes(Mapping[str, "type[Frame]"]):
    """:data:`FRAME_TYPES`: a frame's class by its tag, its module imported at the tag's
    first lookup. ``get`` is the decoder's per-frame path: a dict read once loaded."""

    __slots__ = ("_loaded",)

    def __init__(self) -> None:
        self._loaded: dict[str, type[Frame]] = {}

    def __getitem__(self, tag: str) -> type[Frame]:
        cls = self._loaded.get(tag)
        if cls is None:
            entry = _BY_TAG[tag]
            cls = self._loaded[tag] = getattr(importlib.import_module(entry.module, __name__), entry.name)
        return cls

    def get(self, tag: str, default: Any = None) -> Any:
        cls = self._loaded.get(tag)
        if cls is not None:
            return cls
        return self[tag] if tag in _BY_TAG else default

    def __contains__(self, tag: object) -> bool:
        return tag in _BY_TAG

    def __iter__(self) -> Iterator[str]:
        return iter(_BY_TAG)

    def __len__(self) -> int:
        return len(_BY_TAG)


FRAME_TYPES: Mapping[str, type[Frame]] = FrameTypes()


def frames_of(role: str) -> tuple[type[Frame], ...]:
    """The classes of every frame of ``role``, in :data:`FRAMES`'s order (imports them all)."""
    return tuple(FRAME_TYPES[entry.tag] for entry in FRAMES if entry.role == role)


#: Where each name served here is declared (the records' too): its module's full name.
_HOMES: dict[str, str] = {
    "Frame": f"{__name__}.session",
    **{entry.name: f"{__name__}{entry.module}" for entry in FRAMES},
    **records._HOMES,
}
_serve, __dir__ = lazy_names(__name__, _HOMES)
_BY_ROLE = {"REQUESTS": "request", "REPLIES": "reply", "EVENTS": "event"}


def __getattr__(name: str) -> Any:
    """A frame's or a record's class, or ``REQUESTS``, ``REPLIES``, ``EVENTS``: the
    classes of each role (imports them all: tests and tools, not a command's path)."""
    role = _BY_ROLE.get(name)
    return frames_of(role) if role is not None else _serve(name)
