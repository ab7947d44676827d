"""Tensor glue between the DFlash drafter, the DDTree core and SGLang's tree-verify inputs.

Torch only (no sglang import), device-agnostic and without host syncs except where noted, so the
worker runs it on the GPU and the tests run it on CPU against SGLang's own Triton kernels.

Shapes: ``bs`` requests, ``L`` draft positions (DFlash block size - 1), ``W`` verify window
(``speculative_num_draft_tokens``: DFlash's block size; the tree's ``budget + 1`` slots padded
up to ``W``), ``V`` vocabulary, ``H`` hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..core.tree import (
    PAD_DEPTH,
    PAD_PARENT,
    PAD_RANK,
    PAD_SCORE,
    PAD_TOKEN,
    DDTreeBatch,
    draft_topk,
)
from ..core.verify import ancestor_mask, eagle_verify_links, verify_positions
from ..kernels.accept_path import accept_path, accept_path_available
from ..kernels.draft_topk import MAX_FUSED_K, fused_available, fused_draft_topk

# ---- drafter logits -> per-position top-k log-probs ------------------------------------------


def dense_head_topk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    k: int,
    vocab_size: Optional[int] = None,
    chunk_rows: int = 1024,
    stable: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k log-probs of ``hidden @ weight[:vocab_size].T`` row by row (one LM-head shard = all).

    Args:
        hidden: ``[N, H]`` draft hidden states (DFlash positions 1..L of every request).
        weight: ``[V_padded, H]`` the target's LM-head weight (DFlash borrows the target head).
        k: candidates per row.
        vocab_size: real vocabulary rows of ``weight`` (padding rows excluded); default all.
        chunk_rows: rows per matmul, bounding the ``[chunk, V]`` logits buffer.
        stable: on a CPU, break equal log-probs by the smaller id (a full sort over the
            vocabulary) instead of ``torch.topk``'s unspecified order. On CUDA the fused kernel
            (``kernels.draft_topk``) always applies the smaller-id rule, in one pass over the
            logits. Which of two equally likely tokens gets the smaller rank changes the tree's
            shape, never the output (every emitted token is the target's own choice).

    Returns:
        ``(log_probs, token_ids)``: ``[N, k]`` float32 descending, int64.
    """
    rows = int(hidden.shape[0])
    vocab = int(weight.shape[0]) if vocab_size is None else int(vocab_size)
    k = min(int(k), vocab)
    out_lp = torch.empty((rows, k), dtype=torch.float32, device=hidden.device)
    out_ids = torch.empty((rows, k), dtype=torch.int64, device=hidden.device)
    w = weight[:vocab]
    for start in range(0, rows, int(chunk_rows)):
        end = min(rows, start + int(chunk_rows))
        h = hidden[start:end].to(w.dtype)
        logits = torch.matmul(h, w.T)
        if logits.is_cuda and k <= MAX_FUSED_K and fused_available():
            lp, ids = fused_draft_topk(logits, k)
        else:
            lp, ids = draft_topk(logits, k, stable=stable)
        out_lp[start:end], out_ids[start:end] = lp, ids
    return out_lp, out_ids


def shard_topk_partial(
    logits_local: torch.Tensor, k: int, vocab_start: int, stable: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One vocab-parallel shard's contribution: local top-k logits, their global ids, local lse.

    ``logits_local``: ``[N, V_local]`` float logits of this shard's real (non-padding) rows.
    ``stable``: equal logits inside the shard keep the smaller id first (a full sort; slower).
    """
    x = logits_local.to(torch.float32)
    lse = torch.logsumexp(x, dim=-1)
    k = min(int(k), int(x.shape[-1]))
    if stable:
        values, idx = torch.sort(x, dim=-1, descending=True, stable=True)
        values, idx = values[:, :k].contiguous(), idx[:, :k]
    else:
        values, idx = torch.topk(x, k, dim=-1, largest=True, sorted=True)
    return values, idx.to(torch.int64) + int(vocab_start), lse


def merge_shard_topk(
    values: torch.Tensor, ids: torch.Tensor, lse: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge all-gathered shard partials into the global top-k log-probs.

    Args:
        values: ``[S, N, k_s]`` each shard's top logits; ``ids``: same shape, global token ids;
        lse: ``[S, N]`` each shard's logsumexp.

    Returns:
        ``[N, k]`` log-probs descending (ties: smaller token id first, as ``core.draft_topk``)
        and ``[N, k]`` int64 ids. Equal to ``draft_topk`` of the full logits (up to float
        rounding of the combined logsumexp).
    """
    shards, rows, per = (int(d) for d in values.shape)
    total_lse = torch.logsumexp(lse.to(torch.float32), dim=0)  # [N]
    flat_v = values.permute(1, 0, 2).reshape(rows, shards * per).to(torch.float32)
    flat_i = ids.permute(1, 0, 2).reshape(rows, shards * per).to(torch.int64)
    # Order by id first, then stable-sort by value: ties end up smallest id first.
    by_id = torch.argsort(flat_i, dim=-1, stable=True)
    flat_v, flat_i = flat_v.gather(1, by_id), flat_i.gather(1, by_id)
    order = torch.sort(flat_v, dim=-1, descending=True, stable=True).indices
    k = min(int(k), shards * per)
    top = order[:, :k]
    return flat_v.gather(1, top) - total_lse[:, None], flat_i.gather(1, top)


def vocab_parallel_head_topk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    k: int,
    *,
    num_org: int,
    vocab_start: int,
    world_size: int,
    all_gather: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k log-probs through SGLang's vocab-parallel LM head (``ParallelLMHead``, ``shard_indices``).

    ``weight``: this rank's ``[V_shard_padded, H]`` rows, the first ``num_org`` real, global ids from
    ``vocab_start``. At ``world_size`` 1 the shard is the whole vocabulary: ``dense_head_topk`` (the
    fused top-k on CUDA, one pass over the logits). SGLang's head has ``shard_indices`` at TP 1 too, so
    this is the path of every TP-1 server; the partial-and-merge path below costs a ``torch.topk``
    and a separate logsumexp over the vocabulary (docs/decisions.md, "The fused draft top-k").
    Above 1: each rank's partial (top-k logits, ids, logsumexp), all gathered (``all_gather`` stacks
    a ``[1, ...]`` tensor of every rank along dim 0) and merged.
    """
    if int(world_size) == 1 and int(vocab_start) == 0:
        return dense_head_topk(hidden, weight, k, vocab_size=int(num_org))
    logits = torch.matmul(hidden.to(weight.dtype), weight[: int(num_org)].T)
    values, ids, lse = shard_topk_partial(logits, k, int(vocab_start))
    if int(world_size) == 1:
        return merge_shard_topk(values[None], ids[None], lse[None], k)
    if all_gather is None:
        raise ValueError("vocab_parallel_head_topk: world_size > 1 needs all_gather")
    gathered = [all_gather(t[None].contiguous()) for t in (values, ids, lse)]
    return merge_shard_topk(gathered[0], gathered[1], gathered[2], k)


# ---- tree -> SGLang tree-verify tensors ---------------------------------------------------------


def pad_tree(tree: DDTreeBatch, num_slots: int) -> DDTreeBatch:
    """Widen a tree batch to ``num_slots`` slots with padding slots (never reachable by a walk)."""
    extra = int(num_slots) - tree.num_slots
    if extra < 0:
        raise ValueError(f"cannot pad a tree of {tree.num_slots} slots to {num_slots}")
    if extra == 0:
        return tree

    def widen(t: torch.Tensor, value) -> torch.Tensor:
        pad = torch.full((tree.batch_size, extra), value, dtype=t.dtype, device=t.device)
        return torch.cat([t, pad], dim=1)

    return DDTreeBatch(
        tokens=widen(tree.tokens, PAD_TOKEN),
        parents=widen(tree.parents, PAD_PARENT),
        depths=widen(tree.depths, PAD_DEPTH),
        ranks=widen(tree.ranks, PAD_RANK),
        scores=widen(tree.scores, PAD_SCORE),
        num_nodes=tree.num_nodes,
    )


@dataclass(frozen=True)
class TreeVerifyTensors:
    """What SGLang's NGRAM-style tree verify (``NgramVerifyInput`` + ``eagle_sample``) consumes.

    Attributes:
        tree: the trees, padded to ``W`` slots.
        draft_token: ``[bs * W]`` int64 verify input ids (slot 0 = the root = last bonus token).
        positions: ``[bs * W]`` int64 ``prefix_len + depth``.
        custom_mask: flat bool (or uint8: a view of the attention backend's own mask buffer),
            SGLang's FULL_MASK layout: per request ``W`` rows of ``prefix_len + W`` (prefix
            visible, then the node itself and its ancestors).
        retrieve_index, retrieve_next_token, retrieve_next_sibling: ``[bs, W]`` int64 links.
    """

    tree: DDTreeBatch
    draft_token: torch.Tensor
    positions: torch.Tensor
    custom_mask: torch.Tensor
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor

    @property
    def window(self) -> int:
        return self.tree.num_slots


@dataclass(frozen=True)
class TreeLayout:
    """Everything of a tree verify whose shape depends only on ``(bs, W)``: one CUDA graph's output.

    Attributes:
        tree: the trees, padded to ``W`` slots.
        positions: ``[bs, W]`` int64 ``prefix_len + depth``.
        ancestors: ``[bs, W, W]`` bool ancestor-or-self masks (``core.verify.ancestor_mask``).
        mask_index: ``[bs * W * W]`` int64: where ``ancestors`` lands in the FULL flat mask (the
            tree block of each row; the prefix columns around it stay True).
        retrieve_index, retrieve_next_token, retrieve_next_sibling: ``[bs, W]`` int64 links.
        mask_buffer: the flat buffer the stage wrote the whole FULL mask into (the attention
            backend's verify-mask buffer, see ``tree_step.tree_stage``), or None (not written: the
            mask is built from ``ancestors`` and ``mask_index``).
    """

    tree: DDTreeBatch
    positions: torch.Tensor
    ancestors: torch.Tensor
    mask_index: torch.Tensor
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor
    mask_buffer: Optional[torch.Tensor] = None


def full_mask_index(prefix_lens: torch.Tensor, window: int) -> torch.Tensor:
    """``[bs * W * W]`` int64 flat positions of the tree blocks in SGLang's FULL mask (no host sync).

    Request ``b``'s rows start after the ``W * (prefix + W)`` entries of the requests before it;
    row ``i`` spans ``prefix_b + W`` columns and its tree block starts at column ``prefix_b``.
    """
    w = int(window)
    prefix = prefix_lens.to(torch.int64)
    row_len = prefix + w  # columns per row
    req_start = torch.cumsum(row_len * w, dim=0) - row_len * w  # [bs]
    rows = torch.arange(w, device=prefix.device)
    tree_start = req_start[:, None] + rows[None, :] * row_len[:, None] + prefix[:, None]  # [bs, W]
    return (tree_start[:, :, None] + rows[None, None, :]).reshape(-1)


def full_mask_size(prefix_lens: torch.Tensor, window: int, prefix_lens_cpu: Optional[torch.Tensor] = None) -> int:
    """Entries of the FULL mask: ``sum_b W * (prefix_b + W)``; a host sync only without ``prefix_lens_cpu``."""
    sizes = prefix_lens_cpu if prefix_lens_cpu is not None else prefix_lens
    bs = int(sizes.shape[0])
    return int(sizes.to(torch.int64).sum()) * int(window) + bs * int(window) * int(window)


def full_mask_size_bound(reserved_lens_cpu: torch.Tensor, window: int, context_len: int) -> int:
    """An upper bound on ``full_mask_size`` from host data only: no host sync.

    ``reserved_lens_cpu`` are the KV lengths SGLang allocated for each request's step (DFLASH's
    ``nxt_kv_lens_cpu``): the verify writes the window after the prefix, so ``prefix_b + W`` never
    exceeds them; and no prefix exceeds the model's context, so ``prefix_b + W <= context_len + W``,
    which keeps the bound within SGLang's FULL-mask graph buffer (``W * (context_len + W)`` a request).
    A mask longer than the exact size is read only where the backend's ``mask_indptr`` (from the
    device lengths) points: the entries past the real mask are never read.
    """
    w = int(window)
    per_request = torch.clamp(reserved_lens_cpu.to(torch.int64), max=int(context_len) + w)
    return int(per_request.sum()) * w


def full_custom_mask(
    anc: torch.Tensor,
    prefix_lens: torch.Tensor,
    prefix_lens_cpu: Optional[torch.Tensor] = None,
    mask_index: Optional[torch.Tensor] = None,
    size: Optional[int] = None,
) -> torch.Tensor:
    """SGLang's FULL_MASK flat layout from ``[bs, W, W]`` ancestor masks, without a host loop.

    Per request ``b``: ``W`` rows of ``prefix_lens[b] + W`` bools, the prefix all True, then
    ``anc[b, row]``; requests concatenated. The size is ``size`` when given (at least the exact
    size, e.g. ``full_mask_size_bound``: the entries past the mask are True and never read), else
    it comes from ``prefix_lens_cpu`` when given, else from ``prefix_lens.sum()`` (one host sync
    when ``prefix_lens`` lives on a GPU). ``mask_index`` (``full_mask_index``, e.g. computed inside
    the tree stage's CUDA graph) saves recomputing the scatter positions: then this is two launches
    (fill, scatter).
    """
    bs, w, _ = (int(d) for d in anc.shape)
    total = int(size) if size is not None else full_mask_size(prefix_lens, w, prefix_lens_cpu)
    out = torch.ones(total, dtype=torch.bool, device=anc.device)
    if total == 0:
        return out
    if mask_index is None:
        mask_index = full_mask_index(prefix_lens.to(anc.device), w)
    out[mask_index] = anc.reshape(-1)
    return out


def write_full_mask_torch(out: torch.Tensor, ancestors: torch.Tensor, prefix_lens: torch.Tensor) -> None:
    """``kernels.full_mask.write_full_mask`` with torch ops (CPU without triton): the same entries,
    one host sync for the size; entries past ``out`` are dropped."""
    mask = full_custom_mask(ancestors, prefix_lens)
    n = min(int(mask.numel()), int(out.numel()))
    out[:n] = mask[:n].to(out.dtype)


def tree_layout(
    log_probs: torch.Tensor,
    token_ids: torch.Tensor,
    root_tokens: torch.Tensor,
    prefix_lens: torch.Tensor,
    budget: int,
    top_k: int,
    window: int,
    builder: Optional[Callable[..., DDTreeBatch]] = None,
) -> TreeLayout:
    """Build every request's DDTree and everything of its verify input but the ragged FULL mask.

    Fixed shapes, no host synchronisation (so the tree stage can run in a CUDA graph). Arguments as
    ``build_tree_verify_tensors``.
    """
    check_window(budget, window)
    if builder is None:
        from ..kernels import build_tree as builder  # the kernel on CUDA, build_tree_batched elsewhere
    build = builder
    tree = build(log_probs, token_ids, budget, top_k_cap=top_k, root_tokens=root_tokens)
    return layout_of_tree(tree, prefix_lens, window)


def check_window(budget: int, window: int) -> None:
    """A tree of ``budget`` nodes and its root must fit the verify window."""
    if budget + 1 > window:
        raise ValueError(f"budget {budget} + root does not fit the verify window {window}")


def layout_of_tree(tree: DDTreeBatch, prefix_lens: torch.Tensor, window: int) -> TreeLayout:
    """A built tree's verify layout, padded to ``window`` slots: positions, ancestors, the FULL mask's
    index and the EAGLE verify links, whichever rule grew the tree (fixed shapes, no host sync)."""
    tree = pad_tree(tree, window)
    links = eagle_verify_links(tree)
    prefix = prefix_lens.to(device=tree.device, dtype=torch.int64)
    return TreeLayout(
        tree=tree,
        positions=verify_positions(tree, prefix),
        ancestors=ancestor_mask(tree),
        mask_index=full_mask_index(prefix, window),
        retrieve_index=links.retrive_index,
        retrieve_next_token=links.retrive_next_token,
        retrieve_next_sibling=links.retrive_next_sibling,
    )


def verify_tensors_from_layout(
    layout: TreeLayout,
    prefix_lens: torch.Tensor,
    prefix_lens_cpu: Optional[torch.Tensor] = None,
    mask_size_bound: Optional[int] = None,
) -> TreeVerifyTensors:
    """The tree verify input from a ``TreeLayout``: adds the FULL mask (its size is per-step data).

    The mask's length: exact from ``prefix_lens_cpu`` when given; else ``mask_size_bound``
    (``full_mask_size_bound``: no host sync, and the entries past the real mask are never read);
    else exact from the device lengths, which costs a host sync. Where the stage wrote the mask into
    ``layout.mask_buffer`` and all of it fits there, the mask is that buffer's first entries (a
    view: no launch); else it is built here.
    """
    buffer = layout.mask_buffer
    if prefix_lens_cpu is None and mask_size_bound is not None:
        size = int(mask_size_bound)
    else:
        size = full_mask_size(prefix_lens, layout.tree.num_slots, prefix_lens_cpu)
    if buffer is not None and size <= int(buffer.numel()):
        mask = buffer[:size]
    else:
        mask = full_custom_mask(layout.ancestors, prefix_lens, mask_index=layout.mask_index, size=size)
    return TreeVerifyTensors(
        tree=layout.tree,
        draft_token=layout.tree.tokens.reshape(-1),
        positions=layout.positions.reshape(-1),
        custom_mask=mask,
        retrieve_index=layout.retrieve_index,
        retrieve_next_token=layout.retrieve_next_token,
        retrieve_next_sibling=layout.retrieve_next_sibling,
    )


def build_tree_verify_tensors(
    log_probs: torch.Tensor,
    token_ids: torch.Tensor,
    root_tokens: torch.Tensor,
    prefix_lens: torch.Tensor,
    budget: int,
    top_k: int,
    window: int,
    prefix_lens_cpu: Optional[torch.Tensor] = None,
    builder: Optional[Callable[..., DDTreeBatch]] = None,
) -> TreeVerifyTensors:
    """Build every request's DDTree and lay it out for SGLang's tree verify.

    Args:
        log_probs, token_ids: ``[bs, L, K]`` the drafter's per-position top-k (descending).
        root_tokens: ``[bs]`` each request's root (the last step's bonus token).
        prefix_lens: ``[bs]`` committed KV length per request (the root's position).
        budget: nodes per tree besides the root; ``budget + 1 <= window``.
        top_k: ranks ``>= top_k`` are never used.
        window: verify tokens per request (the DFlash block size).
        prefix_lens_cpu: ``prefix_lens`` on the host when known (avoids a device sync).
        builder: the tree builder, ``build_tree_batched``'s signature and output (default:
            ``sglang_overlay.kernels.build_tree``: the Triton kernel on CUDA tensors, the core's torch
            builder elsewhere; both give the identical tree). The plug point for a faster builder (e.g.
            a GPU kernel) that must produce the identical ``DDTreeBatch``.
    """
    layout = tree_layout(log_probs, token_ids, root_tokens, prefix_lens, budget, top_k, window, builder)
    return verify_tensors_from_layout(layout, prefix_lens, prefix_lens_cpu)


# ---- after acceptance -------------------------------------------------------------------------


@dataclass(frozen=True)
class AcceptedStep:
    """One verify step's outcome in the layout DFlash's scheduler side expects.

    Attributes:
        out_tokens: ``[bs, W]`` int64 tokens emitted this step (accepted drafts, then the bonus),
            0 after ``accept_lens``; the scheduler reads ``accept_lens[b]`` of row ``b``.
        accept_lens: ``[bs]`` int32 tokens emitted (= committed KV rows: root + accepted nodes).
        bonus: ``[bs]`` int64 the next root.
        path_rows: ``[bs, W]`` int64 flat verify rows (``b * W + slot``) of the root and the
            accepted nodes in path order, clamped to valid rows past ``accept_lens`` (for gathers).
        path_positions: ``[bs, W]`` int64 ``prefix_len + j``: where path row ``j`` lands.
    """

    out_tokens: torch.Tensor
    accept_lens: torch.Tensor
    bonus: torch.Tensor
    path_rows: torch.Tensor
    path_positions: torch.Tensor


def accepted_step(
    predict: torch.Tensor,
    accept_index: torch.Tensor,
    accept_lens: torch.Tensor,
    prefix_lens: torch.Tensor,
) -> AcceptedStep:
    """Turn SGLang's tree-verify outputs into emitted tokens, bonus and KV-commit rows.

    Args:
        predict: ``[bs * W]`` the target's token after every verify row (``eagle_sample``).
        accept_index: ``[bs, W]`` flat rows of the root and accepted nodes, -1 after the end.
        accept_lens: ``[bs]`` emitted tokens per request (accepted drafts + 1).
        prefix_lens: ``[bs]`` committed length before this step.

    On CUDA one Triton launch (``kernels.accept_path``, the same result); these torch ops elsewhere.
    """
    if accept_index.is_cuda and accept_path_available():
        out_tokens, lens32, bonus, path_rows, path_positions = accept_path(
            predict, accept_index, accept_lens, prefix_lens
        )
        return AcceptedStep(out_tokens, lens32, bonus, path_rows, path_positions)
    bs, width = (int(d) for d in accept_index.shape)
    device = accept_index.device
    lens = accept_lens.to(device=device, dtype=torch.int64)
    valid = torch.arange(width, device=device)[None, :] < lens[:, None]
    idx = accept_index.to(torch.int64)
    # Rows past the end repeat the last valid one: always in range, never committed.
    last = idx.gather(1, (lens - 1).clamp(min=0)[:, None])
    path_rows = torch.where(valid & (idx >= 0), idx, last)
    tokens = predict.to(torch.int64)[path_rows]
    out_tokens = torch.where(valid, tokens, torch.zeros_like(tokens))
    bonus = out_tokens.gather(1, (lens - 1).clamp(min=0)[:, None]).squeeze(1)
    positions = prefix_lens.to(device=device, dtype=torch.int64)[:, None] + torch.arange(width, device=device)[None, :]
    return AcceptedStep(
        out_tokens=out_tokens,
        accept_lens=lens.to(torch.int32),
        bonus=bonus,
        path_rows=path_rows,
        path_positions=positions,
    )
