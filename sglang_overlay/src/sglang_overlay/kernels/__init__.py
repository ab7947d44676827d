"""GPU kernels of the DDTree overlay.

Modules:
    tree_build  build_tree (dispatch: Triton kernel on CUDA, core.tree.build_tree_batched elsewhere),
                build_tree_kernel, empty_tree_batch, kernel_config, check_kernel_limits, limits
    draft_topk  fused_draft_topk (per-row top-k log-probs from one pass over the logits, Triton),
                draft_topk_fast (the kernel on CUDA, core.tree.draft_topk elsewhere)
    accept_path accept_path (the accepted path of a tree verify in one launch, Triton)
    full_mask   write_full_mask (SGLang's FULL tree-verify mask written in place, one launch, Triton),
                request_starts (its torch counterpart is adapter.tree_verify.write_full_mask_torch)
    kv_move     move_path_kv (each request's accepted path moved to its window's front in every KV
                buffer, nothing when it is in place, Triton), move_path_kv_torch
    tree_attention  tree_verify_attention (the target's tree-verify attention grouped by KV head, Triton),
                extend_fn (wraps SGLang's extend_attention_fwd: tree verifies run it), tree_verify_attention_torch
    warmup      ahead-of-time compilation of the kernel variants into a Triton cache + a JSON manifest
                (``python -m sglang_overlay.kernels.warmup --arch sm_90 ...``)

Loaded lazily: ``import sglang_overlay.kernels`` imports neither torch nor triton.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "tree_build": (
        "MAX_BUDGET",
        "MAX_DEPTH",
        "MAX_TOP_K",
        "KernelConfig",
        "kernel_config",
        "check_kernel_limits",
        "default_num_warps",
        "empty_tree_batch",
        "build_tree_kernel",
        "build_tree",
        "triton_available",
    ),
    "draft_topk": ("MAX_FUSED_K", "fused_draft_topk", "draft_topk_fast", "fused_available"),
    "accept_path": ("accept_path", "accept_path_available"),
    "full_mask": ("write_full_mask", "request_starts", "full_mask_available"),
    "kv_move": ("move_path_kv", "move_path_kv_torch", "kv_move_available"),
    "tree_attention": ("tree_verify_attention", "tree_verify_attention_torch", "tree_attention_available"),
    "warmup": ("warmup_kernels", "WarmupError"),
}
_WHERE = {name: module for module, names in _LAZY.items() for name in names}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
