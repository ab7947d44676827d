"""Static checks of worker.py against the installed SGLang 0.5.23 sources (no import).

worker.py subclasses SGLang's GPU-only DFlashWorkerV2 and cannot be imported on a CPU machine, so
these tests read the sources instead: every name it imports from sglang exists there, every
DFlash member it uses exists on DFlashWorkerV2, and the GPU-side calls it makes take the keyword
arguments it passes. A renamed private API fails here instead of in a GPU server.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from ._helpers import SRC, requires_sglang

pytestmark = requires_sglang

WORKER = SRC / "sglang_overlay" / "adapter" / "worker.py"


def module_source(module: str) -> Path:
    spec = importlib.util.find_spec("sglang")
    root = Path(spec.submodule_search_locations[0]).parent
    path = root.joinpath(*module.split(".")).with_suffix(".py")
    if not path.exists():
        path = root.joinpath(*module.split("."), "__init__.py")
    assert path.exists(), f"{module} is not in the installed sglang"
    return path


def top_level_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names.add(n.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.If, ast.Try)):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.ImportFrom, ast.Import)):
                    for alias in sub.names:
                        names.add((alias.asname or alias.name).split(".")[0])
                elif isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    names.add(sub.name)
                elif isinstance(sub, ast.Assign):
                    for t in sub.targets:
                        if isinstance(t, ast.Name):
                            names.add(t.id)
    return names


def class_node(path: Path, name: str) -> ast.ClassDef:
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"no class {name} in {path}")


def members_of(cls: ast.ClassDef) -> set[str]:
    """Methods, properties and every ``self.X = ...`` attribute assigned anywhere in the class."""
    out = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
                        out.add(n.attr)
    return out


def worker_tree() -> ast.Module:
    return ast.parse(WORKER.read_text(encoding="utf-8"))


def test_every_sglang_import_of_the_worker_exists():
    missing = []
    for node in worker_tree().body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sglang."):
            defined = top_level_names(module_source(node.module))
            missing += [f"{node.module}.{a.name}" for a in node.names if a.name not in defined]
    assert not missing, missing


def test_dflash_members_used_by_the_worker_exist():
    dflash_path = module_source("sglang.srt.speculative.dflash_worker_v2")
    dflash = members_of(class_node(dflash_path, "DFlashWorkerV2"))
    base = members_of(class_node(module_source("sglang.srt.speculative.base_spec_worker"), "BaseSpecWorker"))
    available = dflash | base
    own = set()
    used = set()
    for cls in (n for n in worker_tree().body if isinstance(n, ast.ClassDef)):
        own |= members_of(cls)
        if cls.name != "DDTreeWorker":
            continue
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                used.add(node.attr)
    inherited = used - own
    assert inherited, "the worker uses no DFlash member? the check is broken"
    assert not sorted(inherited - available), sorted(inherited - available)
    # And the overrides really override something of DFlash's.
    for name in ("forward_batch_generation", "_maybe_build_draft_sampler"):
        assert name in dflash


def _receiver(func: ast.expr) -> str:
    """``self.target_worker`` for ``self.target_worker.f(...)``, ``super()`` for ``super().f``."""
    if not isinstance(func, ast.Attribute):
        return ""
    value = func.value
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "super":
        return "super()"
    return ast.unparse(value)


def _call_keywords(func_name: str, receiver: str | None) -> list[set[str]]:
    calls = []
    for node in ast.walk(worker_tree()):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name == func_name and (receiver is None or _receiver(f) == receiver):
                calls.append({k.arg for k in node.keywords if k.arg})
    return calls


@pytest.mark.parametrize(
    "func, receiver, module, cls",
    [
        ("assign_extend_cache_locs_func", None, "sglang.kernels.ops.speculative.cache_locs", None),
        ("eagle_sample", None, "sglang.srt.speculative.eagle_utils", None),
        ("build_grammar_vocab_mask", None, "sglang.srt.speculative.spec_utils", None),
        ("move_accept_tokens_to_target_kvcache", None, "sglang.srt.speculative.spec_utils", None),
        (
            "_append_target_hidden_to_draft_kv_by_loc",
            "self",
            "sglang.srt.speculative.dflash_worker_v2",
            "DFlashWorkerV2",
        ),
        ("_make_next_draft_input_decode", "self", "sglang.srt.speculative.dflash_worker_v2", "DFlashWorkerV2"),
        ("GenerationBatchResult", None, "sglang.srt.managers.utils", None),
        ("ForwardBatch", None, "sglang.srt.model_executor.forward_batch_info", None),
        ("forward_batch_generation", "self.target_worker", "sglang.srt.managers.tp_worker", "TpModelWorker"),
        ("forward_batch_generation", "super()", "sglang.srt.speculative.dflash_worker_v2", "DFlashWorkerV2"),
        (
            "plan",
            "self.target_worker.model_runner.kv_index_translator",
            "sglang.srt.mem_cache.kv_index_translator",
            "KVIndexTranslator",
        ),
    ],
)
def test_keyword_arguments_exist_on_sglangs_side(func, receiver, module, cls):
    path = module_source(module)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    scope = tree.body if cls is None else class_node(path, cls).body
    target = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == func), None)
    assert target is not None, f"{func} not found in {module}"
    if isinstance(target, ast.ClassDef):  # a dataclass: its fields are its keywords
        accepted = {n.target.id for n in target.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    else:
        a = target.args
        accepted = {x.arg for x in a.args + a.kwonlyargs}
    calls = _call_keywords(func, receiver)
    assert calls, f"worker.py makes no {receiver}.{func}(...) call: the check is stale"
    for keywords in calls:
        assert keywords <= accepted, (func, sorted(keywords - accepted))


def test_every_hook_target_exists_in_the_sources():
    from sglang_overlay.adapter import hooks, resolution

    targets = [
        hooks.TARGET_ADD_CLI_ARGS,
        hooks.TARGET_FROM_CLI_ARGS,
        hooks.TARGET_CREATE_WORKER,
        hooks.TARGET_GRAPH_SPEC_INFO,
        *hooks.GRAPH_GUARD_TARGETS,
    ]
    for target in targets:
        module, cls, method = target.rsplit(".", 2)
        node = class_node(module_source(module), cls)
        assert method in {n.name for n in node.body if isinstance(n, ast.FunctionDef)}, target
    # Module-level function targets.
    for target in (hooks.TARGET_CONV_WINDOW_DEDUP,):
        module, function = target.rsplit(".", 1)
        tree = ast.parse(module_source(module).read_text(encoding="utf-8"))
        assert function in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, target
    # The names the hooks import lazily, in the scheduler process.
    for module, name in (
        ("sglang.srt.runtime_context", "get_server_args"),
        ("sglang.srt.configs.hybrid_arch", "mambaish_config"),
        ("sglang.srt.arg_groups.model_override_base", "resolved_view"),
    ):
        tree = ast.parse(module_source(module).read_text(encoding="utf-8"))
        assert name in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, (module, name)
    # The resolution steps the adapter wraps are overridable, and are the pipeline's first step
    # and the step that runs _handle_dflash.
    hooks_src = module_source("sglang.srt.arg_groups.resolution_hooks").read_text(encoding="utf-8")
    for step in (resolution.FIRST_STEP, resolution.SPECULATIVE_STEP):
        assert f'"{step}"' in hooks_src, step
    pipeline = module_source("sglang.srt.arg_groups.pipeline").read_text(encoding="utf-8")
    first_call = pipeline.index("run_hook(")
    assert pipeline.startswith(f"run_hook({resolution.FIRST_STEP}, server_args)", first_call)
    speculative = module_source("sglang.srt.arg_groups.speculative_hook").read_text(encoding="utf-8")
    body = speculative[speculative.index(f"def {resolution.SPECULATIVE_STEP}(") :]
    assert "algo.handle_server_args(server_args)" in body


def test_the_path_kv_move_reads_what_sglangs_pool_holds():
    # path_kv_pool checks these attributes of MHATokenToKVPool and hands data_ptrs, data_strides and
    # _kv_copy_config to kernels.kv_move: a rename in SGLang would silently keep SGLang's move (or break
    # the commit), so it fails here instead.
    source = module_source("sglang.srt.mem_cache.memory_pool").read_text(encoding="utf-8")
    for attr in (
        "data_ptrs",
        "data_strides",
        "_kv_copy_config",
        "use_hnd",
        "use_native_move_kv_cache",
        "native_k_scale_buffer",
        "layer_num",
    ):
        assert f"self.{attr} =" in source, attr
    for key in ("bytes_per_tile", "byte_tiles", "num_warps"):
        assert f'"{key}"' in source, key
    # SGLang's own move takes its targets from the front of each request's window and its sources
    # from out_cache_loc[accept_index]: what kernels.kv_move does per request.
    spec = module_source("sglang.srt.speculative.spec_utils").read_text(encoding="utf-8")
    body = spec[spec.index("def move_accept_tokens_to_target_kvcache(") :]
    body = body[: body.index("\ndef ")]
    assert "fill_front_out_cache_loc_func(" in body and "fill_accept_out_cache_loc_func(" in body


def test_the_mask_size_bound_rests_on_what_sglang_reserves_and_reads():
    # worker.mask_size_bound sizes the FULL mask from DFLASH's reserved host lengths, clamped to the
    # context (tree_verify.full_mask_size_bound). That is sound only while SGLang: keeps those lengths
    # on the draft input; sizes its FULL-mask graph buffer W * (context + W) a request from the
    # model's context; and finds each request's rows through mask_indptr from the device lengths.
    info = module_source("sglang.srt.speculative.dflash_info_v2").read_text(encoding="utf-8")
    assert "self.nxt_kv_lens_cpu = nxt_kv_lens_cpu_t" in info
    assert "reserve = 2 * block_size" in info  # the reservation covers the verify window
    mask = module_source("sglang.srt.layers.attention.verify_mask").read_text(encoding="utf-8")
    assert "per_req = num_draft_tokens * (max_context_len + num_draft_tokens)" in mask
    triton = module_source("sglang.srt.layers.attention.triton_backend").read_text(encoding="utf-8")
    assert "self.max_context_len = model_runner.model_config.context_len" in triton
    assert (
        "seq_mask_len = num_tokens_per_req * (\n                forward_batch.seq_lens + num_tokens_per_req" in triton
    )
    assert "custom_mask[: spec_info.custom_mask.shape[0]] = spec_info.custom_mask" in triton
    source = WORKER.read_text(encoding="utf-8")
    assert "model_runner.model_config.context_len" in source and '"nxt_kv_lens_cpu"' in source
