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


# The reference pages say what the collection does, in the present tense: the runs that measured it (their
# dates, commits, run and issue numbers) live in docs/evidence, docs/decisions and the changelog.
REFERENCE_PAGES = ("testing.md", "rollout-policy.md", "autotune.md", "health-gate.md")
HISTORY = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b(?:[Ii]ssue|[Rr]un|[Ss]ession|[Ss]top) \d+\b|/work/notes/")


def prose(page: Path) -> str:
    """The page without its fenced code blocks (examples of what the collection writes carry their dates)."""
    return re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)


def test_the_reference_pages_hold_no_history():
    found = {
        name: HISTORY.findall(prose(DOCS / name)) for name in REFERENCE_PAGES if HISTORY.search(prose(DOCS / name))
    }
    assert found == {}, "history in reference pages (move it to docs/evidence or docs/decisions): %s" % found


def test_the_reference_pages_and_the_evidence_they_moved_to_link_what_exists():
    pages = [DOCS / name for name in REFERENCE_PAGES] + sorted((DOCS / "evidence").glob("*/README.md"))
    pages.append(DOCS / "evidence" / "gpu-sglang" / "autotune.md")
    for page in pages:
        missing = [target for target in links(page) if not (page.parent / target).exists()]
        assert missing == [], "%s links to what does not exist: %s" % (page.relative_to(REPO_ROOT), missing)
