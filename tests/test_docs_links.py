"""Every relative link of README.md and docs/*.md resolves, anchors included.

The docs are cut and moved between pages (the wire spec in protocol.md, the daemon's rules
on the behaviour pages, the history in changelog.md); a link left pointing at a section
that moved is the drift this test catches. Anchors are GitHub's: the heading, lower-cased,
without punctuation, spaces as hyphens, ``-1``, ``-2``... for repeats.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
_HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
_CODE_SPAN = re.compile(r"`+[^`]*`+")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before de-duplication)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a ``#`` there is no heading, a link no link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def anchors(page: Path) -> set[str]:
    """Every anchor a page offers: its headings' slugs (repeats numbered) and HTML ids."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in _prose_lines(page.read_text(encoding="utf-8")):
        found.update(_HTML_ANCHOR.findall(line))
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[str]:
    """The link targets of a page's prose (code spans and fenced blocks left out)."""
    out: list[str] = []
    for line in _prose_lines(page.read_text(encoding="utf-8")):
        line = _CODE_SPAN.sub("", line)
        out += _LINK.findall(line) + _IMAGE.findall(line)
    return out


def broken(page: Path) -> list[str]:
    """The relative links of one page that name a missing file or anchor."""
    problems = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    return problems


def test_slug_is_githubs() -> None:
    assert slug("7.4 `reset_peaks` → `reset_peaks_ok`") == "74-reset_peaks--reset_peaks_ok"
    assert slug("Jetson: unified memory, nvmap") == "jetson-unified-memory-nvmap"
    assert slug("When `/proc/PID/status` is read") == "when-procpidstatus-is-read"


def test_pages_found() -> None:
    assert ROOT / "docs" / "protocol.md" in PAGES and len(PAGES) > 10


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    assert broken(page) == []
