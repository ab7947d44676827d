"""No unit in plugins/ or the overlay's adapter too long to read in one sitting: a function of at most 60 lines, a class of at most 300,
unless its docstring says why it is longer ("Longer than N lines because ...")."""

import ast

import pytest
from conftest import REPO_ROOT

LIMITS = {ast.FunctionDef: 60, ast.AsyncFunctionDef: 60, ast.ClassDef: 300}
PLUGINS = sorted((REPO_ROOT / "plugins").rglob("*.py"))
ADAPTER = sorted((REPO_ROOT / "sglang_overlay" / "src" / "sglang_overlay" / "adapter").glob("*.py"))


def too_long(path):
    for node in ast.walk(ast.parse(path.read_text())):
        limit = LIMITS.get(type(node))
        if limit is None:
            continue
        lines = node.end_lineno - node.lineno + 1
        why = "Longer than %d lines because" % limit in (ast.get_docstring(node) or "")
        if lines > limit and not why:
            yield "%s:%d %s is %d lines (limit %d)" % (
                path.relative_to(REPO_ROOT),
                node.lineno,
                node.name,
                lines,
                limit,
            )


@pytest.mark.parametrize("path", PLUGINS, ids=lambda path: str(path.relative_to(REPO_ROOT / "plugins")))
def test_no_function_over_60_lines_and_no_class_over_300(path):
    assert list(too_long(path)) == []


@pytest.mark.parametrize("path", ADAPTER, ids=lambda path: path.name)
def test_the_overlays_adapter_has_no_function_over_60_lines_and_no_class_over_300(path):
    assert list(too_long(path)) == []
