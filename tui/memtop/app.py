"""memtop entry point. The full TUI lands with its own issue; until then it says so."""

from __future__ import annotations

import sys


def entry() -> None:
    print("memtop: the TUI is not built yet; use `memagent ls` meanwhile", file=sys.stderr)
    sys.exit(2)
