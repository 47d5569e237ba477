"""How a process learns that ``memagent run`` watches it, whatever its environment.

``memagent run`` judges its tree's exact peaks on each process's kernel high-water mark
(``VmHWM``). The pytest plugin resets that mark before each test (``clear_refs``) to give
each test its own peak, which would take from the run the peak of every test but the last
(docs/pytest.md). So the plugin must not reset under a run, and must know it is under one
even where the environment was stripped (``env -i``, tox, ``sudo``, a CI runner's job
environment): ``MEMAGENT_RUN_PID`` (:data:`UNDER_RUN`) is only the first sign.

The second sign survives every environment: the run names its main thread
:data:`GATE_COMM` (``prctl(PR_SET_NAME)``, the ``comm`` in ``/proc/PID/stat``, which any
process may read), and :func:`gate_ancestor` walks the parent chain looking for it. Only a
thread of the run itself can change its name, so a descendant cannot take the mark away; a
process that names itself ``memagent-run`` can only make a pytest below it give up its
resets (figures flagged not exact), never make a run miss a peak. The walk errs the same
way: an ancestor that cannot be read, or a chain too long to finish, is reported
(:class:`GateSearch` ``unsure``) and the plugin then does not reset either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memagent.proc.procfs import ProcFS

#: Set by ``memagent run`` in CMD's environment (its PID).
UNDER_RUN = "MEMAGENT_RUN_PID"
#: ``memagent run``'s main thread name (at most 15 bytes: the kernel's ``TASK_COMM_LEN``).
GATE_COMM = "memagent-run"
#: The longest parent chain walked; a longer one is not finished (``unsure``).
MAX_ANCESTORS = 128
#: A parent that exits during the walk reparents us (to the nearest subreaper: a run is
#: one); the walk then starts again, this many times at most.
WALK_TRIES = 3


@dataclass(frozen=True, slots=True)
class GateSearch:
    """What the walk found: the run's PID, or why it cannot tell (both None: no run above)."""

    gate: int | None = None
    unsure: str | None = None


def _walk(procfs: ProcFS, pid: int) -> GateSearch | None:
    """One walk up from ``pid``'s parent; None when an ancestor exited meanwhile."""
    from memagent.errors import MemagentError, NoSuchProcess

    current = procfs.stat(pid).ppid
    for _ in range(MAX_ANCESTORS):
        if current <= 0:  # above init, or above our PID namespace's init
            return GateSearch()
        try:
            stat = procfs.stat(current)
        except NoSuchProcess:
            return None
        except MemagentError as exc:  # hidepid, a /proc without it: a gate there is unseen
            return GateSearch(unsure=f"cannot read ancestor PID {current}: {exc}")
        if stat.comm == GATE_COMM:
            return GateSearch(gate=current)
        if current == 1:
            return GateSearch()
        current = stat.ppid
    return GateSearch(unsure=f"more than {MAX_ANCESTORS} ancestors")


def gate_ancestor(procfs: ProcFS, pid: int) -> GateSearch:
    """Whether a ``memagent run`` is an ancestor of ``pid`` (its nearest one)."""
    from memagent.errors import MemagentError

    try:
        for _ in range(WALK_TRIES):
            found = _walk(procfs, pid)
            if found is not None:
                return found
    except MemagentError as exc:  # our own stat: no /proc at all
        return GateSearch(unsure=f"cannot read this process's parent: {exc}")
    return GateSearch(unsure="the parent chain kept changing during the walk")
