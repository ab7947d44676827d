"""Framework-free DDTree core: tree building, verify inputs, verification walks.

Imports no sglang. ``heap`` is plain Python; ``tree``, ``verify``, ``walk`` and ``lattice`` use torch and are
loaded lazily, so ``import sglang_overlay.core`` (and the heap builder) works without torch.

Modules:
    heap    build_tree_heap (the per-request oracle), HeapTree, f32
    tree    DDTreeBatch (the canonical format), draft_topk, build_tree_batched, heap_trees_to_batch
    verify  verify_positions, ancestor_mask, prefix_tree_mask, eagle_verify_links, sglang_tree_mask
    walk    walk_tree, greedy_walk, sampled_walk, sample_target_tokens, kv_keep, compaction_plan
    lattice build_lattice_tree_batched (the tree from a DFlash2 selector lattice), its heap oracle,
            lattice_log_probs, lattice_draft_q
"""

from __future__ import annotations

import importlib
from typing import Any

from .heap import HeapTree, build_tree_heap, f32

_LAZY = {
    "tree": (
        "DDTreeBatch",
        "draft_topk",
        "build_tree_batched",
        "heap_trees_to_batch",
        "rank_key_layout",
        "PAD_TOKEN",
        "PAD_PARENT",
        "PAD_DEPTH",
        "PAD_RANK",
        "PAD_SCORE",
    ),
    "verify": (
        "EagleVerifyLinks",
        "verify_positions",
        "ancestor_mask",
        "prefix_tree_mask",
        "eagle_verify_links",
        "sglang_tree_mask",
    ),
    "walk": (
        "WalkResult",
        "CompactionPlan",
        "walk_tree",
        "greedy_walk",
        "sample_target_tokens",
        "sampled_walk",
        "kv_keep",
        "compaction_plan",
    ),
    "lattice": (
        "LatticeHeapTree",
        "LatticeDraftQ",
        "lattice_temperatures",
        "lattice_log_probs",
        "build_lattice_tree_heap",
        "build_lattice_tree_reference",
        "build_lattice_tree_batched",
        "lattice_slot_candidates",
        "lattice_draft_q",
    ),
}
_WHERE = {name: module for module, names in _LAZY.items() for name in names}

__all__ = ["HeapTree", "build_tree_heap", "f32", *_WHERE]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
