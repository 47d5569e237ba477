"""The daemon's TOML configuration: defaults, file, then command-line flags.

``--config FILE``, else ``/etc/memagent/memagent.toml`` when present. Each key is declared
once, on the field that holds it (:mod:`memagent.config.sections`), and everything about
it is derived from that declaration: the one validation the file and the flags share
(:mod:`.schema`, ``memagent check-config``), the daemon's flags (:mod:`.flags`), the merge
of file and flags (:mod:`.source`), what a SIGHUP applies and what waits for a restart
(:mod:`.reload`), and the key table of ``docs/configuration.md`` (:mod:`.doc`). An unknown
key or a wrong value is an error naming the key and its line, so a typo never silently
keeps a default. Sizes take ``512MiB``, ``2G``, ``1.5GiB`` or a number of bytes
(K/M/G/T and KiB/MiB/GiB/TiB are binary; KB/MB/GB/TB are decimal); without a unit, 0 or at
least 1 MiB.

Layers inside (pyproject.toml's ``config-layers``): doc <- flags | source | reload <- file
<- schema <- sections <- keys <- auto | metrics <- checks.
"""

from __future__ import annotations

from ..errors import ConfigError
from .checks import HOOK_PATH, MAX_SIZE, RESERVED_FOR_ADMINS, Check, KiB, MiB, lookup_user, parse_size
from .file import DEFAULT_PATH, MAX_FILE, default_path, key_line, load, validate
from .keys import LIVE, RESTART, Flag, Key, Reload, Row, copy_live, key, keys_of
from .metrics import split_listen
from .reload import changed_keys, changed_rows, split_changes
from .schema import SCHEMA, check_all, check_of, check_text
from .sections import (
    KEY,
    KEYS,
    AgentConfig,
    AlertConfig,
    HeadroomConfig,
    MetricsConfig,
    OomConfig,
    RecordConfig,
    StackConfig,
    default_of,
)
from .source import SYSTEM_STATE_DIR, ConfigSource, agent_config, default_state_dir

__all__ = [
    "DEFAULT_PATH", "HOOK_PATH", "KEY", "KEYS", "LIVE", "MAX_FILE", "MAX_SIZE", "RESERVED_FOR_ADMINS", "RESTART",
    "SCHEMA", "SYSTEM_STATE_DIR", "AgentConfig", "AlertConfig", "Check", "ConfigError", "ConfigSource", "Flag",
    "HeadroomConfig", "Key", "KiB", "MetricsConfig", "MiB", "OomConfig", "RecordConfig", "Reload", "Row", "StackConfig",
    "agent_config", "changed_keys", "changed_rows", "check_all", "check_of", "check_text", "copy_live", "default_of",
    "default_path", "default_state_dir", "key", "key_line", "keys_of", "load", "lookup_user", "parse_size",
    "split_changes", "split_listen", "validate",
]
