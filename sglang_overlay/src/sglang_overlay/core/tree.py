"""The canonical DDTree tree format and the batched (torch) tree builder.

``build_tree_batched`` is vectorized over requests (one loop over the ``budget`` pop steps, no loop
over requests) and runs on any torch device. Its output equals ``heap.build_tree_heap`` per request,
bit for bit, including ties. A GPU kernel that replaces it must produce the same ``DDTreeBatch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .heap import HeapTree

__all__ = [
    "DDTreeBatch",
    "PAD_TOKEN",
    "PAD_PARENT",
    "PAD_DEPTH",
    "PAD_RANK",
    "PAD_SCORE",
    "draft_topk",
    "build_tree_batched",
    "heap_trees_to_batch",
    "rank_key_layout",
]

# What a slot beyond ``num_nodes`` holds.
PAD_TOKEN = 0
PAD_PARENT = -1
PAD_DEPTH = 0
PAD_RANK = -1
PAD_SCORE = float("-inf")


@dataclass(frozen=True)
class DDTreeBatch:
    """A batch of DDTree trees in the canonical slot format.

    Per request ``b`` there are ``budget + 1`` slots. Slot 0 is the root (the last accepted token,
    supplied by the caller): parent -1, depth 0, rank 0, score 0.0. Slots ``1..num_nodes[b]`` are
    the drafted nodes in pop order, so a parent's slot is always smaller than its children's and
    scores never increase from one slot to the next. Slots beyond ``num_nodes[b]`` are padding:
    token ``PAD_TOKEN`` (0), parent -1, depth 0, rank -1, score -inf.

    Attributes:
        tokens: ``[B, budget + 1]`` int64 token ids (slot 0: the root token).
        parents: ``[B, budget + 1]`` int32 parent slot (-1 for the root and padding).
        depths: ``[B, budget + 1]`` int32 depth (root 0, drafted nodes 1..L).
        ranks: ``[B, budget + 1]`` int32 the node's own rank in its position's top-k list.
        scores: ``[B, budget + 1]`` float32 summed draft log-prob of the path to the node.
        num_nodes: ``[B]`` int32 number of drafted (non-root) nodes.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    ranks: torch.Tensor
    scores: torch.Tensor
    num_nodes: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def budget(self) -> int:
        return int(self.tokens.shape[1]) - 1

    @property
    def num_slots(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def slot_is_node(self) -> torch.Tensor:
        """``[B, budget + 1]`` bool: true for the root and the drafted nodes, false for padding."""
        slots = torch.arange(self.num_slots, device=self.device)
        return slots[None, :] <= self.num_nodes[:, None].to(torch.int64)

    def truncate(self, num_slots: int) -> "DDTreeBatch":
        """The first ``num_slots`` slots (e.g. ``num_nodes.max() + 1`` to drop all-padding columns)."""
        most = int(self.num_nodes.max()) if self.num_nodes.numel() else 0
        if num_slots < 1 or most >= num_slots:
            raise ValueError(f"cannot truncate to {num_slots} slots: a request has {most} nodes")
        return DDTreeBatch(*(getattr(self, f)[:, :num_slots] for f in _FIELDS[:-1]), self.num_nodes)

    def to(self, device: torch.device | str) -> "DDTreeBatch":
        return DDTreeBatch(*(getattr(self, f).to(device) for f in _FIELDS))

    def request(self, b: int) -> dict[str, list]:
        """Request ``b``'s slots ``0..num_nodes`` as Python lists (for tests and debugging)."""
        n = int(self.num_nodes[b]) + 1
        return {f: getattr(self, f)[b, :n].tolist() for f in _FIELDS[:-1]}

    def equals(self, other: "DDTreeBatch") -> bool:
        """Exact equality of every field (scores compared bit for bit, -inf included)."""
        for f in _FIELDS:
            a, b = getattr(self, f), getattr(other, f)
            if a.shape != b.shape or a.dtype != b.dtype:
                return False
            if f == "scores":
                if not torch.equal(a.view(torch.int32), b.view(torch.int32)):
                    return False
            elif not torch.equal(a.cpu(), b.cpu()):
                return False
        return True


_FIELDS = ("tokens", "parents", "depths", "ranks", "scores", "num_nodes")


def draft_topk(
    logits: torch.Tensor,
    k: int,
    temperature: float | None = None,
    stable: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position top-k log-probabilities of draft logits.

    Args:
        logits: ``[..., L, V]`` draft logits (any float dtype; computed in float32).
        k: entries kept per position; clipped to ``V``.
        temperature: when given and > 0, the logits are divided by it before ``log_softmax``.
        stable: break equal log-probs by the smaller token id (a stable sort over the vocabulary;
            the same on every device). ``False`` uses ``torch.topk``: faster, tie order unspecified.

    Returns:
        ``(log_probs, token_ids)``: ``[..., L, k]`` float32 sorted descending, and int64.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    x = logits.to(torch.float32)
    if temperature is not None and temperature > 0:
        x = x / temperature
    log_probs = torch.log_softmax(x, dim=-1)
    k = min(int(k), int(log_probs.shape[-1]))
    if stable:
        values, indices = torch.sort(log_probs, dim=-1, descending=True, stable=True)
        values, indices = values[..., :k].contiguous(), indices[..., :k].contiguous()
    else:
        values, indices = torch.topk(log_probs, k, dim=-1, largest=True, sorted=True)
    return values, indices.to(torch.int64)


def rank_key_layout(depth_limit: int, top_k_cap: int) -> tuple[int, int, int]:
    """How rank tuples are packed into int64 words for tie-breaking.

    Level ``j`` (depth ``j + 1``) stores ``rank + 1`` (0 = the tuple is shorter) in a field of
    ``bits`` bits, ``per_word`` fields per word, most significant field first, using the low 63
    bits of each word. Comparing the words in order as signed int64 is then exactly lexicographic
    order of rank tuples with a proper prefix first.

    Returns:
        ``(bits, per_word, num_words)``.
    """
    bits = max(1, int(top_k_cap).bit_length())
    per_word = 63 // bits
    num_words = max(1, -(-int(depth_limit) // per_word))
    return bits, per_word, num_words


def _empty_batch(batch: int, budget: int, device: torch.device, root_tokens: torch.Tensor | None) -> dict:
    n = budget + 1
    tokens = torch.full((batch, n), PAD_TOKEN, dtype=torch.int64, device=device)
    if root_tokens is not None:
        tokens[:, 0] = root_tokens.to(device=device, dtype=torch.int64).reshape(batch)
    parents = torch.full((batch, n), PAD_PARENT, dtype=torch.int64, device=device)
    depths = torch.full((batch, n), PAD_DEPTH, dtype=torch.int64, device=device)
    ranks = torch.full((batch, n), PAD_RANK, dtype=torch.int64, device=device)
    ranks[:, 0] = 0
    scores = torch.full((batch, n), PAD_SCORE, dtype=torch.float32, device=device)
    scores[:, 0] = 0.0
    num_nodes = torch.zeros(batch, dtype=torch.int64, device=device)
    return dict(tokens=tokens, parents=parents, depths=depths, ranks=ranks, scores=scores, num_nodes=num_nodes)


def _finish(state: dict) -> DDTreeBatch:
    return DDTreeBatch(
        tokens=state["tokens"],
        parents=state["parents"].to(torch.int32),
        depths=state["depths"].to(torch.int32),
        ranks=state["ranks"].to(torch.int32),
        scores=state["scores"],
        num_nodes=state["num_nodes"].to(torch.int32),
    )


def frontier_pick(
    f_valid: torch.Tensor, f_score: torch.Tensor, f_key: torch.Tensor, neg_inf: torch.Tensor, key_max: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One best-first pop over a batch of frontiers: per request the valid candidate with the highest score, ties
    to the smallest packed rank tuple (``f_key [B, n, words]``, compared word by word). Returns ``(active [B],
    slot [B])``: whether the request had a candidate, and which. No host synchronization."""
    pick = f_valid & (f_score == torch.where(f_valid, f_score, neg_inf).amax(dim=1, keepdim=True))
    for w in range(int(f_key.shape[2])):
        kw = f_key[:, :, w]
        pick = pick & (kw == torch.where(pick, kw, key_max).amin(dim=1, keepdim=True))
    return pick.any(dim=1), pick.to(torch.int32).argmax(dim=1)


def build_tree_batched(
    log_probs: torch.Tensor,
    token_ids: torch.Tensor,
    budget: int,
    top_k_cap: int | None = None,
    root_tokens: torch.Tensor | None = None,
) -> DDTreeBatch:
    """Build a batch of DDTree trees; per request identical to ``build_tree_heap``.

    Args:
        log_probs: ``[B, L, K]`` per-position top-k log-probs, descending (``draft_topk``).
            Used in float32.
        token_ids: ``[B, L, K]`` their token ids.
        budget: the maximum number of drafted nodes per request (the tree has ``budget + 1``
            slots).
        top_k_cap: ranks ``>= top_k_cap`` are never used (default ``K``).
        root_tokens: ``[B]`` the root token of each request (slot 0); default ``PAD_TOKEN``.

    Algorithm (simple to mirror in a kernel): every slot ``p`` (root or node) owns at most one
    frontier candidate, its next unexpanded child: rank, score, and the candidate's rank tuple
    packed into int64 words (``rank_key_layout``). A pop step takes, per request, the valid
    candidate with the highest score and, among equal scores, the smallest packed key; writes it as
    the next slot ``t``; advances its parent's candidate to the next rank (the sibling); and gives
    slot ``t`` its first child as candidate. Requests whose frontier is empty stop.
    """
    if log_probs.dim() != 3 or token_ids.shape != log_probs.shape:
        raise ValueError(
            f"expected log_probs and token_ids of one shape [B, L, K], got "
            f"{tuple(log_probs.shape)} and {tuple(token_ids.shape)}"
        )
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    batch, depth_limit, width = (int(s) for s in log_probs.shape)
    if top_k_cap is not None and int(top_k_cap) < 1:
        raise ValueError(f"top_k_cap must be >= 1, got {top_k_cap}")
    cap = width if top_k_cap is None else min(int(top_k_cap), width)
    device = log_probs.device
    state = _empty_batch(batch, budget, device, root_tokens)
    if budget == 0 or depth_limit == 0 or width == 0 or batch == 0:
        return _finish(state)

    lp = log_probs.to(torch.float32)
    ids = token_ids.to(device=device, dtype=torch.int64)
    tokens, parents, depths = state["tokens"], state["parents"], state["depths"]
    ranks, scores, num_nodes = state["ranks"], state["scores"], state["num_nodes"]

    bits, per_word, num_words = rank_key_layout(depth_limit, cap)
    level = torch.arange(depth_limit, device=device)
    level_word = level // per_word
    level_unit = torch.ones(depth_limit, dtype=torch.int64, device=device) << (bits * (per_word - 1 - level % per_word))

    slots = budget + 1
    rows = torch.arange(batch, device=device)
    neg_inf = torch.tensor(float("-inf"), dtype=torch.float32, device=device)
    key_max = torch.tensor(torch.iinfo(torch.int64).max, dtype=torch.int64, device=device)
    zero_i64 = torch.zeros((), dtype=torch.int64, device=device)

    # Frontier: one candidate (the next child to expand) per slot.
    f_valid = torch.zeros((batch, slots), dtype=torch.bool, device=device)
    f_rank = torch.zeros((batch, slots), dtype=torch.int64, device=device)
    f_score = torch.full((batch, slots), float("-inf"), dtype=torch.float32, device=device)
    f_key = torch.zeros((batch, slots, num_words), dtype=torch.int64, device=device)
    f_valid[:, 0] = True
    f_score[:, 0] = scores[:, 0] + lp[:, 0, 0]
    f_key[:, 0, level_word[0]] = level_unit[0]

    for t in range(1, slots):
        active, p = frontier_pick(f_valid, f_score, f_key, neg_inf, key_max)

        r = f_rank[rows, p]
        s = f_score[rows, p]
        key = f_key[rows, p]  # [B, W] (a copy)
        d = depths[rows, p] + 1  # the new node's depth, 1..L
        parent_score = scores[rows, p]

        # Emit slot t.
        tokens[:, t] = torch.where(active, ids[rows, d - 1, r.clamp(max=width - 1)], PAD_TOKEN)
        parents[:, t] = torch.where(active, p.to(torch.int64), PAD_PARENT)
        depths[:, t] = torch.where(active, d, PAD_DEPTH)
        ranks[:, t] = torch.where(active, r, PAD_RANK)
        scores[:, t] = torch.where(active, s, neg_inf)
        num_nodes += active.to(torch.int64)

        # The parent's candidate moves on to the next sibling.
        nr = r + 1
        sib_ok = active & (nr < cap)
        sib_score = parent_score + lp[rows, d - 1, nr.clamp(max=width - 1)]
        f_rank[rows, p] = nr
        f_score[rows, p] = torch.where(sib_ok, sib_score, neg_inf)
        f_valid[rows, p] = sib_ok
        sib_level = d - 1
        f_key[rows, p, level_word[sib_level]] += torch.where(sib_ok, level_unit[sib_level], zero_i64)

        # Slot t's candidate is its first child.
        child_ok = active & (d < depth_limit)
        child_level = d.clamp(max=depth_limit - 1)
        f_valid[:, t] = child_ok
        f_rank[:, t] = 0
        f_score[:, t] = torch.where(child_ok, s + lp[rows, child_level, 0], neg_inf)
        key[rows, level_word[child_level]] += torch.where(child_ok, level_unit[child_level], zero_i64)
        f_key[:, t] = key

    return _finish(state)


def heap_trees_to_batch(
    trees: Sequence[HeapTree],
    budget: int,
    root_tokens: torch.Tensor | Sequence[int] | None = None,
    device: torch.device | str = "cpu",
) -> DDTreeBatch:
    """Lay per-request ``HeapTree`` results out in the canonical ``DDTreeBatch`` format."""
    batch = len(trees)
    roots = None if root_tokens is None else torch.as_tensor(root_tokens, dtype=torch.int64)
    state = _empty_batch(batch, budget, torch.device("cpu"), roots)
    for b, tree in enumerate(trees):
        n = tree.num_nodes
        if n > budget:
            raise ValueError(f"request {b}: {n} nodes exceed the budget {budget}")
        if n == 0:
            continue
        state["tokens"][b, 1 : n + 1] = torch.tensor(tree.tokens, dtype=torch.int64)
        state["parents"][b, 1 : n + 1] = torch.tensor(tree.parents, dtype=torch.int64)
        state["depths"][b, 1 : n + 1] = torch.tensor(tree.depths, dtype=torch.int64)
        state["ranks"][b, 1 : n + 1] = torch.tensor(tree.ranks, dtype=torch.int64)
        state["scores"][b, 1 : n + 1] = torch.tensor(tree.scores, dtype=torch.float32)
        state["num_nodes"][b] = n
    return _finish(state).to(device)
