"""Where the daemon's socket lives: part of the contract, so every client (memagent's
commands, memtop, a client in another language) resolves it the same way:

1. ``--socket PATH``; 2. ``$MEMAGENT_SOCKET``; 3. ``/run/memagent/memagent.sock`` when
running as root; 4. ``$XDG_RUNTIME_DIR/memagent.sock``; 5. ``<tmp>/memagent-<uid>/memagent.sock``.
"""

from __future__ import annotations

import os
import tempfile

SYSTEM_SOCKET = "/run/memagent/memagent.sock"


def socket_path(explicit: str | None = None) -> str:
    if explicit:
        return explicit
    env = os.environ.get("MEMAGENT_SOCKET")
    if env:
        return env
    if os.geteuid() == 0:
        return SYSTEM_SOCKET
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "memagent.sock")
    return os.path.join(tempfile.gettempdir(), f"memagent-{os.geteuid()}", "memagent.sock")
