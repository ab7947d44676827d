"""From a ``DDTreeBatch`` to the inputs of the target's verify forward.

* token ids: ``tree.tokens`` as they are (slot order);
* positions: ``start + depth``;
* the ancestor-only attention mask inside the tree (the prefix is fully visible, outside it);
* SGLang 0.5.23's EAGLE verify links ``retrive_index`` / ``retrive_next_token`` /
  ``retrive_next_sibling`` and its ``tree_mask`` layouts.

SGLang conventions (from ``sglang/kernels/ops/speculative/reconstruct_tree.py`` and
``spec_tree.py`` in the 0.5.23 wheel), with ``n = budget + 1`` verify tokens per request:

* ``retrive_index[b, i] = b * n + i`` (the flat row of slot ``i`` in the verify batch);
* ``retrive_next_token[b, i]`` = the smallest slot that is a child of ``i``, else -1;
* ``retrive_next_sibling[b, i]`` = the smallest slot ``k > i`` with the same parent, else -1;
  -1 for the root (and for padding, which has no parent);
* FULL_MASK ``tree_mask``: per request, ``n`` rows of ``seq_len + n`` bools (prefix columns
  true, then the tree block), requests concatenated, flattened. QLEN_ONLY: the ``n x n`` tree
  block per request, flattened.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import DDTreeBatch

__all__ = [
    "EagleVerifyLinks",
    "verify_positions",
    "ancestor_mask",
    "prefix_tree_mask",
    "eagle_verify_links",
    "sglang_tree_mask",
]


def verify_positions(tree: DDTreeBatch, start: int | torch.Tensor) -> torch.Tensor:
    """``[B, n]`` int64 positions ``start + depth``; ``start`` is the root's position (int or [B]).

    Padding slots get ``start`` (their depth is 0).
    """
    start_t = torch.as_tensor(start, dtype=torch.int64, device=tree.device)
    if start_t.dim() == 0:
        start_t = start_t.expand(tree.batch_size)
    return start_t[:, None] + tree.depths.to(torch.int64)


def ancestor_mask(tree: DDTreeBatch) -> torch.Tensor:
    """``[B, n, n]`` bool: ``mask[b, i, j]`` is true iff slot ``j`` is slot ``i`` or its ancestor.

    Padding slots see only themselves. Free of host synchronisation (the worker calls it inside a
    decode step): reachability by repeated squaring of ``I | parent`` (``ceil(log2 n)`` batched
    matmuls of 0/1 matrices, exact in float32 for any ``n`` below 2**24), instead of climbing a
    data-dependent number of levels.
    """
    n = tree.num_slots
    device = tree.device
    parents = tree.parents.to(torch.int64)
    slots = torch.arange(n, device=device)
    step = (parents.unsqueeze(2) == slots.view(1, 1, n)) | torch.eye(n, dtype=torch.bool, device=device)
    reach = step.to(torch.float32)
    span = 1
    while span < n:  # paths of up to 2 * span edges after each squaring
        reach = torch.bmm(reach, reach).clamp_(max=1.0)
        span *= 2
    return reach > 0


def prefix_tree_mask(tree: DDTreeBatch, prefix_len: int) -> torch.Tensor:
    """``[B, n, prefix_len + n]`` bool: every slot sees the whole prefix, then its ancestors.

    For one common prefix length (as in the reference decoder); SGLang's ragged layout is
    ``sglang_tree_mask``.
    """
    anc = ancestor_mask(tree)
    prefix = torch.ones((tree.batch_size, tree.num_slots, prefix_len), dtype=torch.bool, device=tree.device)
    return torch.cat([prefix, anc], dim=2)


@dataclass(frozen=True)
class EagleVerifyLinks:
    """SGLang's EAGLE tree links, ``[B, n]`` int64 each (``n = budget + 1``)."""

    retrive_index: torch.Tensor
    retrive_next_token: torch.Tensor
    retrive_next_sibling: torch.Tensor


def eagle_verify_links(tree: DDTreeBatch) -> EagleVerifyLinks:
    """The links SGLang's ``verify_tree_greedy`` walks, for the tree's slot order."""
    batch, n = tree.batch_size, tree.num_slots
    device = tree.device
    slots = torch.arange(n, device=device)
    parents = tree.parents.to(torch.int64)
    retrive_index = (torch.arange(batch, device=device)[:, None] * n + slots[None, :]).to(torch.int64)

    sentinel = n  # a Python scalar, not a device tensor: no host->device copy (the tree stage is graph-captured)
    # child[b, i, k]: slot k's parent is slot i.
    child = parents[:, None, :] == slots[None, :, None]
    first_child = torch.where(child, slots[None, None, :], sentinel).amin(dim=2)
    next_token = torch.where(first_child < n, first_child, -1)

    # sib[b, i, k]: k > i, same parent, and i has a parent.
    same_parent = parents[:, :, None] == parents[:, None, :]
    later = slots[None, :] > slots[:, None]
    sib = same_parent & later[None] & (parents >= 0)[:, :, None]
    first_sib = torch.where(sib, slots[None, None, :], sentinel).amin(dim=2)
    next_sibling = torch.where(first_sib < n, first_sib, -1)
    return EagleVerifyLinks(retrive_index, next_token, next_sibling)


def sglang_tree_mask(tree: DDTreeBatch, seq_lens: torch.Tensor, full: bool = True) -> torch.Tensor:
    """SGLang's flat bool ``tree_mask``.

    ``full=True`` (TreeMaskMode.FULL_MASK): for each request ``b`` in order, ``n`` rows of
    ``seq_lens[b] + n`` columns (the prefix all true, then ``ancestor_mask``), concatenated.
    ``full=False`` (TreeMaskMode.QLEN_ONLY): ``ancestor_mask`` flattened, ``[B * n * n]``.
    """
    anc = ancestor_mask(tree)
    if not full:
        return anc.reshape(-1)
    parts = []
    for b, seq_len in enumerate(seq_lens.tolist()):
        prefix = torch.ones((tree.num_slots, int(seq_len)), dtype=torch.bool, device=tree.device)
        parts.append(torch.cat([prefix, anc[b]], dim=1).reshape(-1))
    return torch.cat(parts) if parts else anc.reshape(-1)
