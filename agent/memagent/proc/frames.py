"""What of a sampled Python stack is the program's own (issue 27: "never a wrong stack").

Both samplers (Austin, py-spy) give every frame they read. Three kinds are not a place in
the program and are left out, so that the frame a growth or a peak is credited to is the
program's line that ran:

* a frame the sampler could not read: Austin writes ``:INVALID:`` (no file, no line);
  shown as such it read ``INVALID (?:None)`` in a growth table;
* Python's import machinery (``<frozen importlib._bootstrap>``, ``_external``,
  ``zipimport``): an import is credited to the ``import`` line that ran it, not to
  ``_call_with_frames_removed``;
* memagent's own modules running in the target (the pytest plugin, ``memagent run``'s
  hooks): the test's code called them, or they called it.

A stack of nothing but such frames is empty: no stack rather than a wrong one.
"""

from __future__ import annotations

import re

from memproto.records import StackFrame

#: The function name Austin gives a frame it could not read.
UNREADABLE = "INVALID"
_IMPORT_MACHINERY = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>", "<frozen zipimport>")
#: A module of the memagent package, wherever it is installed (``…/memagent/gate/pytest_plugin.py``).
_OWN = re.compile(r"/memagent/(?:[a-z_]+/)?[a-z_0-9]+\.py$")


def is_program_frame(frame: StackFrame) -> bool:
    """Whether ``frame`` is a place in the program (see the module doc)."""
    filename = frame.filename
    if frame.name == UNREADABLE and filename in ("", "?"):
        return False
    return filename not in _IMPORT_MACHINERY and _OWN.search(filename) is None


def program_frames(frames: list[StackFrame]) -> list[StackFrame]:
    """``frames`` (innermost first) without those that are no place in the program."""
    return [f for f in frames if is_program_frame(f)]
