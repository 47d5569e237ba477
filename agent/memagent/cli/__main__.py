"""``python -m memagent.cli``: the same as the ``memagent`` command."""

from .main import entry

entry()
