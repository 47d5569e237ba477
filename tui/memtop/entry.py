"""The ``memtop`` console script: checks that the TUI's libraries are installed, then runs it.

The memagent distribution always installs ``memtop``, but Textual only with the ``tui``
extra, so that a daemon-only box stays small (README, "On a box"). Without Textual,
``memtop`` says in one line what to install and exits 2, instead of an ImportError
traceback. The check finds the package without importing it: ``memtop --help`` stays fast.
"""

from __future__ import annotations

import importlib.util
import sys

#: Exit status when the TUI's libraries are missing (a usage error, as without a terminal).
MISSING_EXIT = 2
MISSING = ("memtop: the TUI is not installed (no Textual): install memagent[tui], e.g. "
           "pipx install --force 'memagent[tui]' or pip install 'memagent[tui]'")


def tui_installed() -> bool:
    return importlib.util.find_spec("textual") is not None


def main() -> None:
    if not tui_installed():
        print(MISSING, file=sys.stderr)
        sys.exit(MISSING_EXIT)
    from .cli import entry

    entry()


if __name__ == "__main__":
    main()
