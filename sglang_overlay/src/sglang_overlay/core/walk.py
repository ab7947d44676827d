"""Verification walks over a verified tree, and what to keep of the verify KV afterwards.

The walk is the same at any temperature: start at the root (slot 0); take the target's token for
the current slot (its argmax at T = 0, a sample from its distribution at T > 0); if a child of the
current slot carries that token, accept the child and continue from it; otherwise that token is
the bonus token (the next root) and the walk ends. Every emitted token is the target's own choice
given the accepted path, so the output distribution is the target's exactly (lossless).

If several children carry the wanted token (only possible with duplicate ids in a top-k row), the
one in the smallest slot is taken, as SGLang's ``verify_tree_greedy`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import DDTreeBatch

__all__ = [
    "WalkResult",
    "CompactionPlan",
    "walk_tree",
    "greedy_walk",
    "sample_target_tokens",
    "sampled_walk",
    "kv_keep",
    "compaction_plan",
]


@dataclass(frozen=True)
class WalkResult:
    """The outcome of one verification walk per request (``D`` = the walk's maximum depth).

    Attributes:
        path_slots: ``[B, D + 1]`` int64: slot 0 (the root), then the accepted slots in order;
            -1 after the end.
        accept_len: ``[B]`` int64 number of accepted drafted nodes (0..D).
        accepted_tokens: ``[B, D]`` int64 their tokens; -1 after the end.
        bonus: ``[B]`` int64 the target's token after the accepted path (the next root).
        emitted_tokens: ``[B, D + 1]`` int64 ``accepted_tokens`` followed by ``bonus``; -1 after.
    """

    path_slots: torch.Tensor
    accept_len: torch.Tensor
    accepted_tokens: torch.Tensor
    bonus: torch.Tensor
    emitted_tokens: torch.Tensor

    @property
    def num_emitted(self) -> torch.Tensor:
        """``[B]`` tokens this step commits: ``accept_len + 1``."""
        return self.accept_len + 1


def walk_tree(tree: DDTreeBatch, target_tokens: torch.Tensor, max_depth: int | None = None) -> WalkResult:
    """Walk each request's tree with the target's token for every slot.

    Args:
        tree: the verified trees.
        target_tokens: ``[B, n]`` the target's token following each slot (argmax or sample from
            the target's logits at that slot's row of the verify forward).
        max_depth: the walk's step count ``D`` (static shapes, e.g. for CUDA graphs); default:
            the deepest node in the batch.
    """
    batch, n = tree.batch_size, tree.num_slots
    device = tree.device
    if target_tokens.shape != (batch, n):
        raise ValueError(f"target_tokens must be [B, n] = {(batch, n)}, got {tuple(target_tokens.shape)}")
    if max_depth is None:
        max_depth = int(tree.depths.max()) if tree.depths.numel() else 0
    target_tokens = target_tokens.to(torch.int64)
    rows = torch.arange(batch, device=device)
    slots = torch.arange(n, device=device)
    is_node = (slots[None, :] >= 1) & (slots[None, :] <= tree.num_nodes[:, None].to(torch.int64))
    parents = tree.parents.to(torch.int64)

    cur = torch.zeros(batch, dtype=torch.int64, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    accept_len = torch.zeros(batch, dtype=torch.int64, device=device)
    path = torch.full((batch, max_depth + 1), -1, dtype=torch.int64, device=device)
    path[:, 0] = 0
    accepted = torch.full((batch, max_depth), -1, dtype=torch.int64, device=device)
    for step in range(max_depth):
        want = target_tokens[rows, cur]
        match = is_node & (parents == cur[:, None]) & (tree.tokens == want[:, None])
        alive = alive & match.any(dim=1)
        nxt = match.to(torch.int32).argmax(dim=1).to(torch.int64)  # smallest matching slot
        cur = torch.where(alive, nxt, cur)
        path[:, step + 1] = torch.where(alive, nxt, -1)
        accepted[:, step] = torch.where(alive, want, -1)
        accept_len += alive.to(torch.int64)
    bonus = target_tokens[rows, cur]
    emitted = torch.cat([accepted, torch.full((batch, 1), -1, dtype=torch.int64, device=device)], dim=1)
    emitted[rows, accept_len] = bonus
    return WalkResult(path, accept_len, accepted, bonus, emitted)


def greedy_walk(tree: DDTreeBatch, target_logits: torch.Tensor, max_depth: int | None = None) -> WalkResult:
    """T = 0: the target's token at each slot is its argmax (first index on ties)."""
    return walk_tree(tree, target_logits.argmax(dim=-1), max_depth)


def sample_target_tokens(
    target_logits: torch.Tensor,
    temperature: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One independent sample per slot from ``softmax(logits / temperature)``: ``[B, n, V]`` -> ``[B, n]``.

    Sampling every slot up front and then walking is the same in distribution as sampling only at
    the slots the walk visits: each visited slot's token is an independent draw from the target's
    conditional given the accepted path. ``torch.multinomial`` with ``generator`` makes it
    reproducible.
    """
    if temperature <= 0:
        raise ValueError("temperature must be > 0 (use greedy_walk for T = 0)")
    batch, n, vocab = target_logits.shape
    probs = torch.softmax(target_logits.to(torch.float32) / temperature, dim=-1)
    return torch.multinomial(probs.reshape(batch * n, vocab), 1, generator=generator).reshape(batch, n)


def sampled_walk(
    tree: DDTreeBatch,
    target_logits: torch.Tensor,
    temperature: float,
    generator: torch.Generator | None = None,
    max_depth: int | None = None,
) -> WalkResult:
    """T > 0: the target's token at each slot is sampled from its distribution at that slot."""
    return walk_tree(tree, sample_target_tokens(target_logits, temperature, generator), max_depth)


def kv_keep(walk: WalkResult) -> tuple[torch.Tensor, torch.Tensor]:
    """Which verify KV rows (slots) to keep: the root and the accepted path.

    Returns:
        ``(keep_slots, num_keep)``: ``[B, D + 1]`` int64 slots in path order (-1 after the end)
        and ``[B]`` int64 ``accept_len + 1``. The bonus token has no KV yet: it is the next
        step's root.
    """
    return walk.path_slots, walk.accept_len + 1


@dataclass(frozen=True)
class CompactionPlan:
    """Move the kept verify rows to the front of the verify window.

    For request ``b`` and ``j < num_keep[b]``: row ``base[b] + src[b, j]`` goes to row
    ``base[b] + dst[b, j]`` where ``dst[b, j] = j``. Path slots strictly increase and
    ``src >= dst``, so copying in increasing ``j`` is safe in place; ``move`` marks the pairs with
    ``src != dst`` (the others are already in place). After compaction the sequence length is
    ``base + num_keep``.

    Attributes:
        src: ``[B, D + 1]`` int64 absolute source rows (-1 where ``valid`` is false).
        dst: ``[B, D + 1]`` int64 absolute destination rows (-1 where ``valid`` is false).
        valid: ``[B, D + 1]`` bool ``j < num_keep``.
        move: ``[B, D + 1]`` bool ``valid & (src != dst)``.
        num_keep: ``[B]`` int64.
    """

    src: torch.Tensor
    dst: torch.Tensor
    valid: torch.Tensor
    move: torch.Tensor
    num_keep: torch.Tensor


def compaction_plan(walk: WalkResult, base: int | torch.Tensor = 0) -> CompactionPlan:
    """The compaction of each request's verify window, whose slot 0 sits at row ``base`` (int or [B])."""
    keep, num_keep = kv_keep(walk)
    batch, width = keep.shape
    device = keep.device
    base_t = torch.as_tensor(base, dtype=torch.int64, device=device)
    if base_t.dim() == 0:
        base_t = base_t.expand(batch)
    j = torch.arange(width, device=device)[None, :]
    valid = j < num_keep[:, None]
    src = torch.where(valid, base_t[:, None] + keep, -1)
    dst = torch.where(valid, base_t[:, None] + j, -1)
    return CompactionPlan(src, dst, valid, valid & (src != dst), num_keep)
