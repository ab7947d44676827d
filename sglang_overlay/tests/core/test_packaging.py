"""The core's import boundaries and the package metadata."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
from importlib import metadata

import sglang_overlay

SRC = pathlib.Path(sglang_overlay.__file__).parent


def test_package_and_heap_import_without_torch_or_sglang():
    code = (
        "import sys, sglang_overlay, sglang_overlay.core\n"
        "from sglang_overlay.core import build_tree_heap\n"
        "t = build_tree_heap([[-0.5, -1.0]], [[4, 5]], 2)\n"
        "assert t.tokens == [4, 5], t\n"
        "bad = [m for m in ('torch', 'sglang', 'numpy') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_core_never_imports_sglang():
    for path in sorted((SRC / "core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            assert not any(n == "sglang" or n.startswith("sglang.") for n in names), f"{path}: {names}"


def test_distribution_metadata():
    dist = metadata.distribution("ddtree-sglang-overlay")
    assert dist.version == sglang_overlay.__version__ == "0.1.0"
    assert not [r for r in (dist.requires or []) if "extra ==" not in r], "no hard runtime dependency"
    eps = [ep for ep in dist.entry_points if ep.group == "sglang.srt.plugins"]
    assert [(ep.name, ep.value) for ep in eps] == [("ddtree", "sglang_overlay.adapter.plugin:load_plugin")]
