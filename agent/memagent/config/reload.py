"""What a SIGHUP changes: the keys whose values differ between the running configuration
and the one read again, split by each key's declared ``reload``.

A :data:`~memagent.config.keys.LIVE` key is applied by the part that uses it (each has an
``apply``, called by :meth:`memagent.agent.Agent.reload`, which only orchestrates); a
:data:`~memagent.config.keys.RESTART` key keeps its running value and the reload says a
restart is needed. :func:`memagent.config.keys.copy_live` copies only live keys, so a
restart key can never be applied by accident.
"""

from __future__ import annotations

from .keys import RESTART, Row, keys_of
from .sections import AgentConfig


def changed_rows(running: AgentConfig, new: AgentConfig) -> list[Row]:
    """The keys whose values differ between two configurations, in table order."""
    return [row for row in keys_of(type(running)) if row.get(running) != row.get(new)]


def changed_keys(running: AgentConfig, new: AgentConfig) -> list[str]:
    """The file keys whose values differ between two configurations, in table order."""
    return [row.key.file for row in changed_rows(running, new)]


def split_changes(running: AgentConfig, new: AgentConfig) -> tuple[list[str], list[str]]:
    """(the changed keys a reload applies, those kept until a restart), as file keys."""
    rows = changed_rows(running, new)
    return ([r.key.file for r in rows if r.key.reload is not RESTART],
            [r.key.file for r in rows if r.key.reload is RESTART])
