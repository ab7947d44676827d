"""SGLang's own definitions, run from its installed source without importing their modules.

`sglang.srt.models.dflash` and `sglang.srt.speculative.dflash_utils` import torchvision (through
`sglang.srt.configs`) and SGLang's GPU kernel libraries (tvm_ffi), which have no CPU build beside the test
venv's torch. The definitions the harness must agree with (the grouped convolution, the candidate selector,
the decoder layer's forward, the draft config's parser) need none of that: `definitions` compiles them from
the installed file's text, verbatim, with the file's own imports of the standard library and torch. Names
they use from the rest of SGLang are given as `stubs` (and `torch.compile`'s `disable=_is_npu` is True here,
so the compiled functions run as the plain Python they are).
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import sys
import types
from pathlib import Path
from types import SimpleNamespace


def sglang_root() -> Path | None:
    """The installed sglang package's directory, or None (nothing of it is imported)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _wanted(tree: ast.Module, names: list[str]) -> list[ast.stmt]:
    """The top-level definitions `names` (NAME, or CLASS.METHOD for one method of a class), in the file's order."""
    nodes = []
    for name in names:
        outer, _sep, method = name.partition(".")
        found = None
        for node in tree.body:
            target = [t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else []
            if getattr(node, "name", None) == outer or outer in target:
                found = node
        if found is None:
            raise LookupError("SGLang's source defines no %s" % outer)
        if method:
            found = next((n for n in found.body if getattr(n, "name", None) == method), None)
            if found is None:
                raise LookupError("SGLang's %s has no %s" % (outer, method))
        nodes.append(found)
    return nodes


def _plain_imports(tree: ast.Module) -> list[ast.stmt]:
    """The file's top-level imports of anything but SGLang (and its optional kernels)."""
    out = []
    for node in tree.body:
        if isinstance(node, ast.Import) and not any(a.name.startswith(("sglang", "sgl_")) for a in node.names):
            out.append(node)
        elif isinstance(node, ast.ImportFrom) and not (node.module or "").startswith(("sglang", "sgl_")):
            out.append(node)
    return out


def definitions(relpath: str, names: list[str], **stubs) -> SimpleNamespace:
    """SGLang's `names` from sglang/RELPATH, compiled from its text; METHOD for CLASS.METHOD."""
    root = sglang_root()
    if root is None:
        raise ModuleNotFoundError("sglang is not installed")
    path = root / relpath
    tree = ast.parse(path.read_text(), str(path))
    body = _plain_imports(tree) + _wanted(tree, names)
    # a module of its own (dataclasses look their module up in sys.modules), named apart from SGLang's
    module = types.ModuleType("sglang_source_" + relpath.replace("/", "_").removesuffix(".py"))
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    namespace.update(
        logger=logging.getLogger(module.__name__), get_compiler_backend=lambda: "eager", _is_npu=True, **stubs
    )
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return SimpleNamespace(**{name.rpartition(".")[2]: namespace[name.rpartition(".")[2]] for name in names})


def source_text(relpath: str) -> str:
    return (sglang_root() / relpath).read_text()
