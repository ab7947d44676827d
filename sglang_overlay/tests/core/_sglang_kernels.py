"""Load SGLang 0.5.23's own Triton verify kernels for comparison tests (run under TRITON_INTERPRET=1).

Two ways, both running SGLang's code from the installed sglang package:
  1. import the modules. On a machine without GPU, ``reconstruct_tree`` imports the compiled
     ``sgl_kernel.speculative`` op at module level, which a CPU stack lacks; a placeholder module
     stands in for it during that import only (the op itself is never called: the Triton kernel
     is what is compared).
  2. if importing fails for another reason (e.g. SGLang's own dependencies are missing), extract
     the Triton kernels and their launch wrappers from the installed source files by name and load
     just those.
If sglang or triton is not installed, the caller skips.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
import tempfile
import types
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class SglangKernels:
    reconstruct_indices_from_tree_mask: Callable  # reconstruct_indices_from_tree_mask_triton
    verify_tree_greedy: Callable  # verify_tree_greedy_triton
    how: str


_RECONSTRUCT = "sglang.kernels.ops.speculative.reconstruct_tree"
_SPEC_TREE = "sglang.kernels.ops.speculative.spec_tree"


def _import_real() -> SglangKernels:
    spec_tree = importlib.import_module(_SPEC_TREE)
    added = []
    try:
        try:
            importlib.import_module("sgl_kernel.speculative")
        except ImportError:
            for name in ("sgl_kernel", "sgl_kernel.speculative"):
                if name not in sys.modules:
                    stub = types.ModuleType(name)
                    stub.__path__ = []  # a package, so the submodule import resolves

                    def _not_here(*args, **kwargs):
                        raise RuntimeError("placeholder for the compiled sgl_kernel op")

                    stub.reconstruct_indices_from_tree_mask = _not_here
                    sys.modules[name] = stub
                    added.append(name)
        reconstruct = importlib.import_module(_RECONSTRUCT)
    finally:
        for name in added:
            sys.modules.pop(name, None)
    return SglangKernels(
        reconstruct.reconstruct_indices_from_tree_mask_triton,
        spec_tree.verify_tree_greedy_triton,
        "imported from sglang" + (" (placeholder sgl_kernel)" if added else ""),
    )


_EXTRACT = {
    "kernels/ops/speculative/reconstruct_tree.py": (
        "_reconstruct_tree_mask_kernel",
        "_num_warps_for",
        "reconstruct_indices_from_tree_mask_triton",
    ),
    "kernels/ops/speculative/spec_tree.py": ("verify_tree_greedy_kernel_triton", "verify_tree_greedy_triton"),
}


def _extract_from_source() -> SglangKernels:
    spec = importlib.util.find_spec("sglang")
    root = spec.submodule_search_locations[0]
    parts = [
        "import torch\nimport triton\nimport triton.language as tl\n",
        "def next_power_of_2(n):\n    return 1 if n <= 1 else 1 << (n - 1).bit_length()\n",
    ]
    for rel, names in _EXTRACT.items():
        with open(os.path.join(root, rel), encoding="utf-8") as fh:
            source = fh.read()
        lines = source.splitlines()
        found = {}
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and node.name in names:
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                found[node.name] = "\n".join(lines[first - 1 : node.end_lineno])
        missing = [n for n in names if n not in found]
        if missing:
            raise ImportError(f"{rel}: no {', '.join(missing)} in the installed sglang")
        parts.extend(found[n] for n in names)
    # Triton needs the kernels' source on disk (inspect.getsource).
    path = os.path.join(tempfile.mkdtemp(prefix="ddtree-sgl-kernels-"), "sglang_verify_kernels.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n\n\n".join(parts) + "\n")
    mod_spec = importlib.util.spec_from_file_location("sglang_verify_kernels", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return SglangKernels(
        module.reconstruct_indices_from_tree_mask_triton,
        module.verify_tree_greedy_triton,
        "extracted from the installed sglang sources",
    )


def load() -> SglangKernels | str:
    """The kernels, or a reason why they are unavailable (for pytest.skip)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return "TRITON_INTERPRET=1 is not set (no GPU here)"
    for name in ("sglang", "triton"):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed"
    try:
        return _import_real()
    except Exception as first:  # noqa: BLE001 - any import failure: try the extraction
        try:
            return _extract_from_source()
        except Exception as second:  # noqa: BLE001
            return f"cannot load SGLang's kernels: import failed ({first!r}); extraction failed ({second!r})"
