"""The run/admit gate: would it fit, the supervisor of ``memagent run`` and its verdict, the
outputs (summary, JSON, JUnit) and the pytest plugin. No command-line code: :mod:`memagent.cli` calls this."""

#: ``admit --basis`` and ``run --fits --basis``: the bound that decides the exit status
#: (:mod:`memagent.gate.fits`), here so that a parser needs no judge.
WORST_CASE, OBSERVED = "worst-case", "observed"
BASES = (WORST_CASE, OBSERVED)
