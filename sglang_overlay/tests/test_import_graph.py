"""The package's import graph: no circle, and the layers point one way.

Read from the source (``ast``), so no module is imported: every ``import sglang_overlay...`` and
relative ``from . import ...``, at module level or inside a function, is an edge. ``core`` (the
framework-free algorithm) and ``kernels`` (Triton) never reach ``adapter`` (the SGLang glue), and
``knobs`` (the environment registry) imports nothing of the package, so every layer may use it.
Not seen: imports by string (``importlib.import_module``), e.g. ``kernels/__init__``'s lazy names.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "sglang_overlay"


def module_files(src: Path = SRC) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``)."""
    mods = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        mods[".".join(parts)] = (path, is_package)
    return mods


def _imported_names(tree: ast.AST, package: str) -> set[str]:
    """Every dotted name an import statement anywhere in ``tree`` may bind (module or module.attr)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (the longest known prefix of each imported name)."""
    mods = module_files(src)
    graph = {}
    for name, (path, is_package) in mods.items():
        package = name if is_package else name.rpartition(".")[0]
        edges = set()
        for imported in _imported_names(ast.parse(path.read_text(encoding="utf-8")), package):
            while imported and imported not in mods:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                edges.add(imported)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> Optional[list[str]]:
    """One import circle as ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> Optional[list[str]]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def in_layer(module: str, layer: str) -> bool:
    return module == f"{PACKAGE}.{layer}" or module.startswith(f"{PACKAGE}.{layer}.")


GRAPH = import_graph()


def test_the_graph_is_read_from_the_source():
    # Guards against a parser that sees nothing: relative imports at module level, inside a function
    # (algorithm's worker factory) and across layers (absolute imports: test_the_checks_catch_...).
    assert f"{PACKAGE}.adapter.hooks" in GRAPH[f"{PACKAGE}.adapter.worker"]
    assert f"{PACKAGE}.adapter.worker" in GRAPH[f"{PACKAGE}.adapter.algorithm"]
    assert f"{PACKAGE}.core.tree" in GRAPH[f"{PACKAGE}.kernels.draft_topk"]
    assert len(GRAPH) > 25


def test_no_import_circle():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


@pytest.mark.parametrize("layer", ["core", "kernels"])
def test_core_and_kernels_never_reach_the_adapter(layer):
    wrong = {
        f"{module} -> {target}"
        for module in GRAPH
        if in_layer(module, layer)
        for target in reachable(GRAPH, module)
        if in_layer(target, "adapter")
    }
    assert not wrong, f"{layer}/ must not import adapter/ (directly or through another module): {sorted(wrong)}"


def test_core_imports_nothing_of_the_overlay_but_core_and_knobs():
    wrong = {
        f"{module} -> {target}"
        for module in GRAPH
        if in_layer(module, "core")
        for target in GRAPH[module]
        if not (in_layer(target, "core") or target in (PACKAGE, f"{PACKAGE}.knobs"))
    }
    assert not wrong


def test_the_knob_registry_is_a_leaf():
    assert GRAPH[f"{PACKAGE}.knobs"] <= {PACKAGE}


def test_the_checks_catch_what_they_look_for():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    tree = ast.parse(
        "from ..adapter import tree_verify\ndef f():\n    from .x import y\n    import sglang_overlay.core.tree\n"
    )
    names = _imported_names(tree, "sglang_overlay.kernels")
    assert {"sglang_overlay.adapter.tree_verify", "sglang_overlay.kernels.x.y", "sglang_overlay.core.tree"} <= names
