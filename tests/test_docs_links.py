"""The README is a newcomer's page and every link in it and in docs/ leads somewhere: each
relative link names a file that exists and, with an anchor, a heading of that file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# The README's own budget (issue 31): what it is, the two commands, a first job, own data,
# the dashboard and links; everything else lives in docs/.
README_MAX_LINES = 250


def anchors(page: Path) -> set[str]:
    """GitHub's ids for the page's headings: lower case, punctuation dropped, spaces to '-'."""
    heads = [line.lstrip("#").strip() for line in page.read_text().splitlines()
             if re.match(r"#{1,6} ", line)]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # links in code are code
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    assert not broken, f"{page.name}: {broken}"


def test_the_readme_is_short_and_links_each_docs_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    linked = {Path(t.partition("#")[0]).name for t in relative_links(ROOT / "README.md")}
    moved = ["cli", "job-spec", "own-data", "configuration", "deployment", "fleet", "multi-gpu",
             "reliability-and-security", "library", "development", "dashboard"]
    assert {f"{name}.md" for name in moved} <= linked
    for name in moved:
        assert "Contents:" in (ROOT / "docs" / f"{name}.md").read_text(), name
