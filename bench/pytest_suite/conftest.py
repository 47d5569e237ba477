"""One budget marker on every test of the sample suite, chosen by the bench
(bench/pytest_compare.py) through ``BENCH_BUDGET_MARK``, for the same budget
``BENCH_BUDGET_MIB``: so the tests themselves carry no marker and each run asks one tool.

- ``memory_budget``: memagent's, on the test's peak RSS (pytest's own RSS included);
- ``memory_budget-growth``: memagent's, ``growth=True``: peak RSS minus RSS at the test's start;
- ``limit_memory``: pytest-memray's, on the heap memray saw allocated at its high-water mark.
"""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    kind = os.environ.get("BENCH_BUDGET_MARK", "")
    mib = int(os.environ.get("BENCH_BUDGET_MIB", "100"))
    marks = {
        "": None,
        "memory_budget": pytest.mark.memory_budget(f"{mib}MiB"),
        "memory_budget-growth": pytest.mark.memory_budget(f"{mib}MiB", growth=True),
        "limit_memory": pytest.mark.limit_memory(f"{mib}MB"),  # memray's MB is 1024**2 bytes
    }
    if kind not in marks:
        raise pytest.UsageError(f"BENCH_BUDGET_MARK: one of {', '.join(map(repr, marks))}, not {kind!r}")
    mark = marks[kind]
    for item in items:
        if mark is not None:
            item.add_marker(mark)
