"""The documentation site's home page is the README (up to its list of pages), with the README's
links into ``docs/`` made relative to the site."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _before_the_pages(text: str, heading: str) -> str:
    head, found, _ = text.partition(f"\n{heading}\n")
    assert found, f"no {heading!r} heading"
    return head


def test_the_site_s_home_page_is_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8").replace("](docs/", "](")
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert _before_the_pages(index, "## The pages") == _before_the_pages(readme, "## Documentation")


def test_every_page_of_the_site_is_in_its_navigation():
    mkdocs = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = {str(path.relative_to(ROOT / "docs")) for path in (ROOT / "docs").rglob("*.md")}
    missing = sorted(page for page in pages if page not in mkdocs)
    assert missing == []
