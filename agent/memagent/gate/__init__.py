"""The run/admit gate: would it fit, the supervisor of ``memagent run`` and its verdict, the
outputs (summary, JSON, JUnit) and the pytest plugin. No command-line code: :mod:`memagent.cli` calls this."""
