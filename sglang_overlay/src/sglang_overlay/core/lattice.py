"""The DDTree tree grown from a DFlash2 candidate selector's lattice.

A DFlash2 drafter (SGLang 0.5.23, ``models/dflash.py``: ``DFlash2DraftModel.compute_candidates`` and
``CandidateSelector.build_lattice``) gives per request ``K`` candidates for each of the ``E`` block
slots and a lattice of transition scores:

* ``candidate_ids[b, e, c]`` (int64): candidate ``c`` of slot ``e`` (slot ``e`` is depth ``e + 1``);
* ``scores[b, e, p, c]``: for ``e = 0`` the score of candidate ``c`` given the verified anchor (row
  ``p = 0``; upstream's rows ``p >= 1`` of slot 0 repeat it and are ignored here); for ``e >= 1``
  the score of candidate ``c`` at slot ``e`` given candidate ``p`` at slot ``e - 1``.

SGLang walks one path through it. Here a best-first tree is grown over it, under a node budget,
and returned as the same ``DDTreeBatch`` the marginal builder (``core.tree``) returns, so everything
downstream (verify links, masks, walks, kernels) is unchanged.

Rule (see docs/core.md, "The tree from a DFlash2 lattice"):

* Conditional rows: ``cond[b, e, p, :] = log_softmax(scores[b, e, p, :] / T_b)`` in float32,
  sorted descending (a stable sort: equal values keep the smaller candidate index first). A node's
  **rank** is its candidate's position in its parent's sorted row (the root's row is
  ``cond[b, 0, 0]``), so rank 0 is the parent's best continuation.
* **Score**: ``fl32(parent_score + cond[b, e, parent_candidate, rank])``, root 0.0: one float32
  addition per node, parent first, exactly as ``core.heap``.
* **Best-first**, as ``core.heap``: start with the root's rank-0 child; pop the highest score,
  ties to the smaller rank tuple (a proper prefix first, so parents precede children); each pop
  emits a node and pushes its next sibling (rank + 1 in the same parent's row, if ``< top_k_cap``)
  and its first child (rank 0 in the node's own row at the next slot, if its depth ``< E``). Stop
  after ``budget`` nodes.

When every row of a slot is the same for all parents, the tree equals ``build_tree_batched`` on
the per-slot ``draft_topk`` of that row, bit for bit: the lattice generalizes the marginal tree.

Builders: ``build_lattice_tree_heap`` (one request, plain Python ``heapq``: the oracle),
``build_lattice_tree_reference`` (the heap per request, laid out as a ``DDTreeBatch``) and
``build_lattice_tree_batched`` (vectorized over requests, one loop over the pop steps with no host
synchronization inside it, any device). ``lattice_draft_q`` gives each slot's draft distribution.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from .heap import HeapTree, f32
from .tree import PAD_TOKEN, DDTreeBatch, _empty_batch, _finish, frontier_pick, heap_trees_to_batch, rank_key_layout

__all__ = [
    "LatticeHeapTree",
    "LatticeDraftQ",
    "lattice_temperatures",
    "lattice_log_probs",
    "build_lattice_tree_heap",
    "build_lattice_tree_reference",
    "build_lattice_tree_batched",
    "lattice_slot_candidates",
    "lattice_draft_q",
]


@dataclass(frozen=True)
class LatticeHeapTree(HeapTree):
    """``HeapTree`` plus each node's candidate index ``c`` (``candidate_ids[b, depth - 1, c]``)."""

    candidates: list[int]


# --- inputs ----------------------------------------------------------------------------------


def _check_lattice(candidate_ids: torch.Tensor, scores: torch.Tensor) -> tuple[int, int, int]:
    if candidate_ids.dim() != 3 or scores.dim() != 4:
        raise ValueError(
            f"expected candidate_ids [B, E, K] and scores [B, E, K, K], got {tuple(candidate_ids.shape)} "
            f"and {tuple(scores.shape)}"
        )
    batch, slots, width = (int(s) for s in candidate_ids.shape)
    if tuple(scores.shape) != (batch, slots, width, width):
        raise ValueError(f"scores must be [B, E, K, K] = {(batch, slots, width, width)}, got {tuple(scores.shape)}")
    return batch, slots, width


def lattice_temperatures(
    temperature: float | torch.Tensor | None, batch: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``[B]`` float32 divisors: ``temperature`` where it is > 0, else 1.0 (no scaling).

    ``temperature`` is ``None``, a number, or a ``[B]`` tensor (per-request temperatures; entries
    ``<= 0``, e.g. greedy requests, get 1.0). Like ``draft_topk``: scaling applies only to T > 0.
    """
    if temperature is None:
        return torch.ones(batch, dtype=torch.float32, device=device)
    t = torch.as_tensor(temperature, dtype=torch.float32, device=device)
    if t.dim() == 0:
        t = t.expand(batch)
    t = t.reshape(-1)
    if t.shape[0] != batch:
        raise ValueError(f"expected {batch} temperatures, got {t.shape[0]}")
    return torch.where(t > 0, t, torch.ones_like(t))


def lattice_log_probs(
    scores: torch.Tensor, temperature: float | torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The lattice's conditional rows, sorted: what every builder here consumes.

    Args:
        scores: ``[B, E, K, K]`` lattice scores (any float dtype; used in float32).
        temperature: ``None``, a number or ``[B]`` (see ``lattice_temperatures``).

    Returns:
        ``(cond_lp, cond_order)``, both ``[B, E, K, K]``: ``cond_lp[b, e, p, r]`` (float32) is the
        ``r``-th largest value of ``log_softmax(scores[b, e, p, :] / T_b)``, and
        ``cond_order[b, e, p, r]`` (int64) the candidate index it belongs to. Equal values keep the
        smaller candidate index first (stable sort), on every device.
    """
    if scores.dim() != 4:
        raise ValueError(f"expected scores [B, E, K, K], got {tuple(scores.shape)}")
    x = scores.to(torch.float32)
    temps = lattice_temperatures(temperature, int(x.shape[0]), x.device)
    cond = torch.log_softmax(x / temps[:, None, None, None], dim=-1)
    values, order = torch.sort(cond, dim=-1, descending=True, stable=True)
    return values.contiguous(), order.to(torch.int64).contiguous()


# --- the oracle: one request, plain Python ---------------------------------------------------


def build_lattice_tree_heap(
    cond_lp: Sequence[Sequence[Sequence[float]]],
    cond_order: Sequence[Sequence[Sequence[int]]],
    candidate_ids: Sequence[Sequence[int]],
    budget: int,
    top_k_cap: int | None = None,
) -> LatticeHeapTree:
    """Build one request's tree best-first over its lattice with a binary heap.

    Args:
        cond_lp: ``[E][K][K]`` one request's ``lattice_log_probs`` values (rows sorted descending;
            rounded to float32, exact for values taken from a float32 tensor).
        cond_order: ``[E][K][K]`` their candidate indices.
        candidate_ids: ``[E][K]`` the token id of each candidate.
        budget: the maximum number of non-root nodes.
        top_k_cap: ranks ``>= top_k_cap`` are never used (default ``K``).

    Returns:
        The nodes in pop order; ``candidates[i]`` is node ``i``'s candidate index at its slot.
    """
    slots = len(cond_lp)
    if len(cond_order) != slots or len(candidate_ids) != slots:
        raise ValueError("cond_lp, cond_order and candidate_ids must have E slots each")
    width = len(candidate_ids[0]) if slots else 0
    for e in range(slots):
        if len(candidate_ids[e]) != width or len(cond_lp[e]) != width or len(cond_order[e]) != width:
            raise ValueError(f"slot {e}: expected {width} candidates and {width} rows")
        for p in range(width):
            if len(cond_lp[e][p]) != width or len(cond_order[e][p]) != width:
                raise ValueError(f"slot {e}, row {p}: expected {width} entries")
            if any(math.isnan(v) or v == math.inf for v in cond_lp[e][p]):
                raise ValueError(f"slot {e}, row {p}: log-probs contain NaN or +inf")
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    if top_k_cap is not None and int(top_k_cap) < 1:
        raise ValueError(f"top_k_cap must be >= 1, got {top_k_cap}")
    cap = width if top_k_cap is None else min(int(top_k_cap), width)
    lp = [[[f32(float(v)) for v in row] for row in slot] for slot in cond_lp]
    tree = LatticeHeapTree([], [], [], [], [], [], [])
    if budget == 0 or slots == 0 or width == 0:
        return tree

    # Entries: (-score, rank tuple, parent slot, parent score, depth, rank, row), row = the
    # parent's candidate index (0 for the root: the anchor row of slot 0). Rank tuples are unique,
    # so the payload after them is never compared.
    heap = [(-f32(0.0 + lp[0][0][0]), (0,), 0, 0.0, 1, 0, 0)]
    while heap and tree.num_nodes < budget:
        neg_score, ranks, parent, parent_score, depth, rank, row = heapq.heappop(heap)
        score = -neg_score
        slot = tree.num_nodes + 1
        e = depth - 1
        cand = int(cond_order[e][row][rank])
        tree.tokens.append(int(candidate_ids[e][cand]))
        tree.parents.append(parent)
        tree.depths.append(depth)
        tree.ranks.append(rank)
        tree.scores.append(score)
        tree.rank_tuples.append(ranks)
        tree.candidates.append(cand)
        if rank + 1 < cap:  # next sibling: the same parent's next-best continuation
            sib = f32(parent_score + lp[e][row][rank + 1])
            heapq.heappush(heap, (-sib, ranks[:-1] + (rank + 1,), parent, parent_score, depth, rank + 1, row))
        if depth < slots:  # first child: this node's best continuation, from its own row
            child = f32(score + lp[depth][cand][0])
            heapq.heappush(heap, (-child, ranks + (0,), slot, score, depth + 1, 0, cand))
    return tree


def build_lattice_tree_reference(
    candidate_ids: torch.Tensor,
    scores: torch.Tensor,
    budget: int,
    temperature: float | torch.Tensor | None = None,
    top_k_cap: int | None = None,
    root_tokens: torch.Tensor | Sequence[int] | None = None,
) -> tuple[DDTreeBatch, list[LatticeHeapTree]]:
    """``build_lattice_tree_heap`` per request, as a (CPU) ``DDTreeBatch`` and the heap trees.

    The conditional rows are computed on ``scores``' device (so a CUDA batched build can be
    compared bit for bit), then the heap runs on the host.
    """
    batch, _, _ = _check_lattice(candidate_ids, scores)
    cond_lp, cond_order = (x.cpu() for x in lattice_log_probs(scores, temperature))
    ids = candidate_ids.cpu()
    trees = [
        build_lattice_tree_heap(cond_lp[b].tolist(), cond_order[b].tolist(), ids[b].tolist(), budget, top_k_cap)
        for b in range(batch)
    ]
    roots = None if root_tokens is None else _cpu(root_tokens)
    return heap_trees_to_batch(trees, budget, roots), trees


def _cpu(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


# --- the batched builder ---------------------------------------------------------------------


def build_lattice_tree_batched(
    candidate_ids: torch.Tensor,
    scores: torch.Tensor,
    budget: int,
    temperature: float | torch.Tensor | None = None,
    top_k_cap: int | None = None,
    root_tokens: torch.Tensor | None = None,
) -> DDTreeBatch:
    """Build a batch of trees over DFlash2 lattices; per request identical to the heap oracle.

    Args:
        candidate_ids: ``[B, E, K]`` int64 candidate token ids per slot (``compute_candidates``).
        scores: ``[B, E, K, K]`` lattice scores (``CandidateSelector.build_lattice``).
        budget: the maximum number of drafted nodes per request (``budget + 1`` slots).
        temperature: ``None``, a number or ``[B]`` per-request temperatures; the rows are
            ``log_softmax(scores / T)``, with T <= 0 read as 1 (see ``lattice_temperatures``).
        top_k_cap: ranks ``>= top_k_cap`` are never used (default ``K``).
        root_tokens: ``[B]`` the root token of each request (the anchor); default ``PAD_TOKEN``.

    Returns:
        The ``DDTreeBatch`` (``core.tree``'s canonical format; ``ranks`` are ranks within the
        parent's conditional row).

    Algorithm: ``core.tree.build_tree_batched``'s frontier (one candidate per slot: its next
    unexpanded child, with score, rank and packed rank-tuple key), plus each slot's candidate
    index, which selects the row its children are drawn from. No host synchronization in the loop.
    """
    batch, slots_e, width = _check_lattice(candidate_ids, scores)
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    if top_k_cap is not None and int(top_k_cap) < 1:
        raise ValueError(f"top_k_cap must be >= 1, got {top_k_cap}")
    cap = width if top_k_cap is None else min(int(top_k_cap), width)
    device = scores.device
    state = _empty_batch(batch, budget, device, root_tokens)
    if budget == 0 or slots_e == 0 or width == 0 or batch == 0:
        return _finish(state)

    lp, order = lattice_log_probs(scores, temperature)  # [B, E, K, K] each, rows sorted
    ids = candidate_ids.to(device=device, dtype=torch.int64)
    tokens, parents, depths = state["tokens"], state["parents"], state["depths"]
    ranks, tree_scores, num_nodes = state["ranks"], state["scores"], state["num_nodes"]

    bits, per_word, num_words = rank_key_layout(slots_e, cap)
    level = torch.arange(slots_e, device=device)
    level_word = level // per_word
    level_unit = torch.ones(slots_e, dtype=torch.int64, device=device) << (bits * (per_word - 1 - level % per_word))

    n = budget + 1
    rows = torch.arange(batch, device=device)
    neg_inf = torch.tensor(float("-inf"), dtype=torch.float32, device=device)
    key_max = torch.tensor(torch.iinfo(torch.int64).max, dtype=torch.int64, device=device)
    zero_i64 = torch.zeros((), dtype=torch.int64, device=device)
    last_rank = width - 1

    # Each slot's candidate index at its own block slot; the root's 0 selects slot 0's anchor row.
    cand = torch.zeros((batch, n), dtype=torch.int64, device=device)
    f_valid = torch.zeros((batch, n), dtype=torch.bool, device=device)
    f_rank = torch.zeros((batch, n), dtype=torch.int64, device=device)
    f_score = torch.full((batch, n), float("-inf"), dtype=torch.float32, device=device)
    f_key = torch.zeros((batch, n, num_words), dtype=torch.int64, device=device)
    f_valid[:, 0] = True
    f_score[:, 0] = tree_scores[:, 0] + lp[:, 0, 0, 0]
    f_key[:, 0, level_word[0]] = level_unit[0]

    for t in range(1, n):
        active, p = frontier_pick(f_valid, f_score, f_key, neg_inf, key_max)

        r = f_rank[rows, p]
        s = f_score[rows, p]
        key = f_key[rows, p]  # [B, W] (a copy)
        d = depths[rows, p] + 1  # the new node's depth, 1..E
        e = d - 1  # its block slot
        row = cand[rows, p]  # the parent's candidate: the row the new node was drawn from
        parent_score = tree_scores[rows, p]
        c = order[rows, e, row, r.clamp(max=last_rank)]

        # Emit slot t.
        tokens[:, t] = torch.where(active, ids[rows, e, c], PAD_TOKEN)
        parents[:, t] = torch.where(active, p.to(torch.int64), -1)
        depths[:, t] = torch.where(active, d, 0)
        ranks[:, t] = torch.where(active, r, -1)
        tree_scores[:, t] = torch.where(active, s, neg_inf)
        cand[:, t] = torch.where(active, c, zero_i64)
        num_nodes += active.to(torch.int64)

        # The parent's candidate moves on to its next sibling (same row, next rank).
        nr = r + 1
        sib_ok = active & (nr < cap)
        f_rank[rows, p] = nr
        f_score[rows, p] = torch.where(sib_ok, parent_score + lp[rows, e, row, nr.clamp(max=last_rank)], neg_inf)
        f_valid[rows, p] = sib_ok
        f_key[rows, p, level_word[e]] += torch.where(sib_ok, level_unit[e], zero_i64)

        # Slot t's candidate is its first child: rank 0 of its own row at the next block slot.
        child_ok = active & (d < slots_e)
        child_e = d.clamp(max=slots_e - 1)
        f_valid[:, t] = child_ok
        f_rank[:, t] = 0
        f_score[:, t] = torch.where(child_ok, s + lp[rows, child_e, c, 0], neg_inf)
        key[rows, level_word[child_e]] += torch.where(child_ok, level_unit[child_e], zero_i64)
        f_key[:, t] = key

    return _finish(state)


# --- the draft distribution per slot ---------------------------------------------------------


def lattice_slot_candidates(tree: DDTreeBatch, cond_order: torch.Tensor) -> torch.Tensor:
    """``[B, n]`` int64: each drafted slot's candidate index at its block slot (-1: root, padding).

    Recovered from the tree alone: a node at depth ``d`` with rank ``r`` whose parent has candidate
    ``p`` (the root: 0) is ``cond_order[b, d - 1, p, r]`` (``lattice_log_probs``'s second output,
    with the temperature the tree was built with). One step per depth, parents first.
    """
    batch, n = tree.batch_size, tree.num_slots
    device = tree.device
    order = cond_order.to(device)
    slots_e, width = int(order.shape[1]), int(order.shape[2])
    rows = torch.arange(batch, device=device)[:, None].expand(batch, n)
    is_node = tree.slot_is_node() & (torch.arange(n, device=device)[None, :] >= 1)
    depth = tree.depths.to(torch.int64)
    parents = tree.parents.to(torch.int64).clamp(min=0)
    rank = tree.ranks.to(torch.int64).clamp(0, max(width - 1, 0))
    cand = torch.zeros((batch, n), dtype=torch.int64, device=device)  # the root's row is 0
    for d in range(1, slots_e + 1):
        here = is_node & (depth == d)
        parent_cand = cand.gather(1, parents)
        got = order[rows, d - 1, parent_cand, rank]
        cand = torch.where(here, got, cand)
    return torch.where(is_node, cand, -1)


@dataclass(frozen=True)
class LatticeDraftQ:
    """Per slot, the draft distribution its children were drawn from.

    Attributes:
        probs: ``[B, n, K]`` float32: for a slot at depth ``d < E`` (the root included),
            ``softmax(scores[b, d, c, :] / T_b)`` over slot ``d``'s candidates, ``c`` the slot's own
            candidate index (the root: 0, the anchor row). Zero rows for depth-``E`` slots (no
            children) and padding.
        candidate_ids: ``[B, n, K]`` int64 the tokens those probabilities are over
            (``candidate_ids[b, d]``); -1 where ``probs`` is a zero row.
        slot_candidates: ``[B, n]`` int64 each drafted slot's own candidate index (-1: root, padding).
    """

    probs: torch.Tensor
    candidate_ids: torch.Tensor
    slot_candidates: torch.Tensor


def lattice_draft_q(
    tree: DDTreeBatch,
    candidate_ids: torch.Tensor,
    scores: torch.Tensor,
    temperature: float | torch.Tensor | None = None,
) -> LatticeDraftQ:
    """The per-node draft distribution ``q`` of a tree built from this lattice and temperature.

    This is the data a rejection-sampling verify (SpecInfer-style multi-draft, or SGLang's
    ``tree_speculative_sampling_target_only`` with a draft q) would need: for each node, the
    distribution over its block slot's candidates that its children were drawn from. The overlay's
    sampled verify does not use it: it samples the target's token at each visited slot and walks
    the tree (``core.walk.sampled_walk``), which is lossless for any tree, however it was built. So
    ``q`` is not needed for losslessness; it is here for a rejection-sampling verify or diagnostics.
    """
    batch, slots_e, width = _check_lattice(candidate_ids, scores)
    device = tree.device
    x = scores.to(device=device, dtype=torch.float32)
    temps = lattice_temperatures(temperature, batch, device)
    _, order = lattice_log_probs(x, temps)
    slot_cand = lattice_slot_candidates(tree, order)
    n = tree.num_slots
    rows = torch.arange(batch, device=device)[:, None].expand(batch, n)
    depth = tree.depths.to(torch.int64)
    has_row = tree.slot_is_node() & (depth < slots_e)
    e = depth.clamp(max=max(slots_e - 1, 0))
    own = slot_cand.clamp(min=0)  # the root (-1) reads row 0
    probs = torch.softmax(x / temps[:, None, None, None], dim=-1)[rows, e, own]  # [B, n, K]
    probs = torch.where(has_row[:, :, None], probs, torch.zeros((), dtype=torch.float32, device=device))
    ids = candidate_ids.to(device=device, dtype=torch.int64)[rows, e]
    ids = torch.where(has_row[:, :, None], ids, torch.full((), -1, dtype=torch.int64, device=device))
    return LatticeDraftQ(probs, ids, slot_cand)
