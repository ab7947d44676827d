"""Plain-Python DDTree builder: one request at a time, with a binary heap.

This is the oracle every other builder (the batched torch builder, the GPU kernel) must match
exactly. It needs neither torch nor numpy.

Semantics (see docs/core.md for the full statement):

* A node is a rank tuple ``(r1, ..., rd)`` at depth ``d`` (1..L); ``r_i`` indexes the top-k list
  of draft position ``i - 1``. Its token is ``token_ids[d - 1][rd]``.
* Its score is accumulated in float32, parent first:
  ``score(r1..rd) = f32(score(r1..r(d-1)) + f32(log_probs[d - 1][rd]))`` with ``score(()) = 0.0``.
  One float32 addition per node, in a fixed order, is bit-reproducible by any IEEE-754 float32
  adder (torch on CPU or GPU, Triton), which is the point.
* Best-first: start with ``(0,)``; pop the highest score, ties broken by the smaller rank tuple in
  lexicographic order, a proper prefix being smaller (so a parent precedes its children). Each pop
  emits a node and pushes its next sibling ``(r1..rd + 1)`` if ``rd + 1 < top_k_cap`` and its
  first child ``(r1..rd, 0)`` if ``d < L``. Stop after ``budget`` nodes or on an empty heap.
"""

from __future__ import annotations

import heapq
import math
import struct
from dataclasses import dataclass
from typing import Sequence

__all__ = ["HeapTree", "build_tree_heap", "f32"]

_F32 = struct.Struct("<f")


def f32(x: float) -> float:
    """Round a Python float to the nearest float32 (ties to even), returned as a Python float.

    For the sum of two float32 values, rounding the exact float64 sum to float32 gives the
    correctly rounded float32 sum (53 >= 2 * 24 + 2, so the double rounding is innocuous).
    """
    try:
        return _F32.unpack(_F32.pack(x))[0]
    except OverflowError:  # finite in float64, beyond float32's range: rounds to infinity
        return math.copysign(math.inf, x)


@dataclass(frozen=True)
class HeapTree:
    """One request's tree in pop order. Index ``i`` here is slot ``i + 1`` of the canonical format.

    ``parents`` are slots (0 = the root); ``rank_tuples[i]`` is the node's full rank tuple.
    """

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    ranks: list[int]
    scores: list[float]
    rank_tuples: list[tuple[int, ...]]

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)


def _check_inputs(
    log_probs: Sequence[Sequence[float]],
    token_ids: Sequence[Sequence[int]],
    budget: int,
    top_k_cap: int | None,
) -> tuple[int, int, int]:
    depth_limit = len(log_probs)
    if len(token_ids) != depth_limit:
        raise ValueError(f"log_probs has {depth_limit} positions but token_ids has {len(token_ids)}")
    width = len(log_probs[0]) if depth_limit else 0
    for i in range(depth_limit):
        if len(log_probs[i]) != width or len(token_ids[i]) != width:
            raise ValueError(f"position {i}: expected {width} log-probs and token ids")
        if any(math.isnan(v) or v == math.inf for v in log_probs[i]):
            raise ValueError(f"position {i}: log_probs contain NaN or +inf")
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    if top_k_cap is not None and int(top_k_cap) < 1:
        raise ValueError(f"top_k_cap must be >= 1, got {top_k_cap}")
    cap = width if top_k_cap is None else min(int(top_k_cap), width)
    return depth_limit, width, cap


def build_tree_heap(
    log_probs: Sequence[Sequence[float]],
    token_ids: Sequence[Sequence[int]],
    budget: int,
    top_k_cap: int | None = None,
) -> HeapTree:
    """Build one request's DDTree best-first under a node budget.

    Args:
        log_probs: ``[L][K]`` per-position top-k log-probabilities, descending within a position.
            Values are rounded to float32 first (exact for values taken from a float32 tensor).
        token_ids: ``[L][K]`` the token id of each of those entries.
        budget: the maximum number of non-root nodes.
        top_k_cap: ranks ``>= top_k_cap`` are never used (default: ``K``).

    Returns:
        The nodes in pop order (at most ``budget``; fewer when the heap runs dry).
    """
    depth_limit, width, cap = _check_inputs(log_probs, token_ids, budget, top_k_cap)
    lp = [[f32(float(v)) for v in row] for row in log_probs]
    tree = HeapTree([], [], [], [], [], [])
    if budget == 0 or depth_limit == 0 or width == 0:
        return tree

    # Entries compare as (-score, rank_tuple): higher score first, then smaller rank tuple.
    # Python's tuple order makes a proper prefix smaller, as required.
    # Payload: parent slot, parent score, depth, rank. (rank tuples are unique, so the payload
    # is never compared.)
    first = f32(0.0 + lp[0][0])
    heap: list[tuple[float, tuple[int, ...], int, float, int, int]] = [(-first, (0,), 0, 0.0, 1, 0)]
    while heap and tree.num_nodes < budget:
        neg_score, ranks, parent, parent_score, depth, rank = heapq.heappop(heap)
        score = -neg_score
        slot = tree.num_nodes + 1
        tree.tokens.append(int(token_ids[depth - 1][rank]))
        tree.parents.append(parent)
        tree.depths.append(depth)
        tree.ranks.append(rank)
        tree.scores.append(score)
        tree.rank_tuples.append(ranks)
        if rank + 1 < cap:
            sib = f32(parent_score + lp[depth - 1][rank + 1])
            heapq.heappush(heap, (-sib, ranks[:-1] + (rank + 1,), parent, parent_score, depth, rank + 1))
        if depth < depth_limit:
            child = f32(score + lp[depth][0])
            heapq.heappush(heap, (-child, ranks + (0,), slot, score, depth + 1, 0))
    return tree
