"""The artefacts kept beside the code: the doc's key table is the one generated from the
declarations, and the example file (packaging/memagent.toml) names only keys that exist,
set or commented out, and passes ``check-config``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import memagent_cli

from memagent.config import KEY, load
from memagent.config.doc import DOC, main, markdown, rendered

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "packaging" / "memagent.toml"


def test_the_doc_table_is_up_to_date() -> None:
    assert DOC == ROOT / "docs" / "configuration.md"
    assert main(["--check"]) == 0, "docs/configuration.md: run python -m memagent.config.doc"
    text = DOC.read_text(encoding="utf-8")
    assert markdown() in text
    stale = text.replace("| `stacks.sampler` |", "| `stacks.sampling` |")
    assert rendered(stale) == text  # what the check compares with: the table made again


def test_the_stale_check_fails_on_a_stale_table(tmp_path: Path) -> None:
    doc = tmp_path / "configuration.md"
    doc.write_text(DOC.read_text(encoding="utf-8").replace("| `interval` |", "| `intervall` |"), encoding="utf-8")
    assert main(["--check", str(doc)]) == 1
    assert main([str(doc)]) == 0 and main(["--check", str(doc)]) == 0  # rewritten


@pytest.mark.e2e
def test_the_example_file_names_only_known_keys_and_passes_check_config() -> None:
    assert load(str(EXAMPLE))
    out = memagent_cli("check-config", str(EXAMPLE))
    assert out.returncode == 0 and out.stdout.startswith(f"{EXAMPLE}: valid"), out.stderr
    # A table of labels ([budgets], [oom_score_adj]) is one key: its lines are examples.
    label_tables = {k for k, row in KEY.items() if "." not in k and isinstance(row.key.default, dict)}
    assert label_tables == {"budgets", "oom_score_adj"}
    section, named = None, set()
    for line in EXAMPLE.read_text(encoding="utf-8").splitlines():
        table = re.match(r"^#?\s*\[(\w+)\]", line)
        if table:
            section = table.group(1)
            continue
        m = re.match(r"^#?\s?([a-z_]+) = ", line)
        if section in label_tables:
            named.add(section)
        elif m:
            named.add(m.group(1) if section is None else f"{section}.{m.group(1)}")
    unknown = sorted(k for k in named if k not in KEY)
    assert not unknown, f"packaging/memagent.toml names keys that do not exist: {unknown}"
    missing = sorted(k for k in KEY if k not in named)
    assert not missing, f"packaging/memagent.toml does not mention: {missing}"
