"""The documentation is reachable from its indexes, and their pointers point at something.

docs/README.md links every page of docs/ and the decisions' index; docs/decisions/README.md links every
decision and names code that exists (a file, a glob that matches, or a name the file defines).
"""

import re
from pathlib import Path

from conftest import REPO_ROOT

DOCS = REPO_ROOT / "docs"
DECISIONS = DOCS / "decisions"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def links(page: Path) -> list:
    return [target for target in LINK.findall(page.read_text()) if not target.startswith("http")]


def test_every_link_of_the_indexes_and_the_readme_resolves():
    for page in (REPO_ROOT / "README.md", DOCS / "README.md", DECISIONS / "README.md"):
        missing = [target for target in links(page) if not (page.parent / target).exists()]
        assert missing == [], "%s links to what does not exist: %s" % (page.relative_to(REPO_ROOT), missing)


def test_the_docs_index_lists_every_page():
    listed = {(DOCS / target).resolve() for target in links(DOCS / "README.md")}
    pages = {page.resolve() for page in DOCS.glob("*.md") if page.name != "README.md"}
    assert sorted(str(page.relative_to(DOCS.resolve())) for page in pages - listed) == []
    assert (DECISIONS / "README.md").resolve() in listed


def test_the_decisions_index_lists_every_decision_and_names_code_that_exists():
    index = (DECISIONS / "README.md").read_text()
    listed = set(links(DECISIONS / "README.md"))
    assert (
        sorted(page.name for page in DECISIONS.glob("*.md") if page.name != "README.md" and page.name not in listed)
        == []
    )
    for path in re.findall(r"`((?:roles|plugins|lab|scripts|tests|docs)/[^`\s]+)`", index):
        assert list(REPO_ROOT.glob(path.rstrip("/"))), "docs/decisions/README.md names %s, which does not exist" % path
