"""Every link in the README and docs/ resolves inside the repository (a clone has nothing else)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A bare path in backticks that names a doc, e.g. `docs/twin.md` or `reference.md`.
DOC_MENTION = re.compile(r"`((?:\.\./)*[\w./-]+\.md)`")


def _targets(md: Path):
    text = md.read_text(encoding="utf-8")
    for m in LINK.finditer(text):
        yield m.group(1)
    for m in DOC_MENTION.finditer(text):
        yield m.group(1)


@pytest.mark.parametrize("md", DOCS, ids=lambda p: p.name)
def test_links_resolve_inside_the_repository(md):
    broken = []
    for target in _targets(md):
        if re.match(r"^[a-z]+://|^mailto:|^#", target):
            continue
        path = target.split("#", 1)[0]
        if not path:
            continue
        resolved = (md.parent / path).resolve()
        from_root = (ROOT / path).resolve()
        inside = any(p.is_relative_to(ROOT) and p.exists() for p in (resolved, from_root))
        if not inside:
            broken.append(target)
    assert not broken, f"{md.relative_to(ROOT)} links outside the repository or to nothing: {broken}"


@pytest.mark.parametrize("md", DOCS, ids=lambda p: p.name)
def test_no_doc_cites_the_developers_notes(md):
    """reference.md, machines.md and ../shared/docs are the developers' notes, not part of a clone."""
    text = md.read_text(encoding="utf-8")
    found = re.findall(r"shared/docs|\breference(?:-2)?\.md|\bmachines\.md|seed-notes\.md", text)
    assert not found, f"{md.relative_to(ROOT)} cites {sorted(set(found))}"
