"""The heap builder's semantics, and the batched builder against it (exactly, ties included)."""

from __future__ import annotations

import itertools
import math
import random
import zlib

import pytest
import torch

from sglang_overlay.core.heap import build_tree_heap, f32
from sglang_overlay.core.tree import (
    DDTreeBatch,
    build_tree_batched,
    draft_topk,
    heap_trees_to_batch,
    rank_key_layout,
)

# --- helpers -------------------------------------------------------------------------------


def brute_force_tree(log_probs, token_ids, budget, cap=None):
    """The same tree from first principles: enumerate every rank tuple, sort by (-score, tuple)."""
    depth_limit, width = len(log_probs), len(log_probs[0])
    cap = width if cap is None else min(cap, width)
    lp = [[f32(v) for v in row] for row in log_probs]
    nodes = []
    for d in range(1, depth_limit + 1):
        for ranks in itertools.product(range(cap), repeat=d):
            score = 0.0
            for i, r in enumerate(ranks):
                score = f32(score + lp[i][r])
            nodes.append((-score, ranks))
    nodes.sort()
    # Best-first with monotone scores (parent >= child, rank r >= rank r+1) pops exactly the
    # first `budget` tuples of this order.
    chosen = [ranks for _, ranks in nodes[:budget]]
    slot = {(): 0}
    out = []
    for i, ranks in enumerate(chosen):
        slot[ranks] = i + 1
        out.append((token_ids[len(ranks) - 1][ranks[-1]], slot[ranks[:-1]], len(ranks), ranks[-1]))
    return out


def random_inputs(gen: torch.Generator, batch, depth_limit, width, ties: bool):
    if ties:
        # Few distinct values, many exact ties within and across positions and requests.
        levels = torch.tensor([0.0, -0.5, -0.5, -1.0, -1.5, -3.0])
        lp = levels[torch.randint(0, len(levels), (batch, depth_limit, width), generator=gen)]
    else:
        lp = torch.log_softmax(torch.randn(batch, depth_limit, max(width, 2) * 3, generator=gen) * 2, -1)
        lp = lp[..., :width]
    lp = lp.sort(dim=-1, descending=True).values.contiguous()
    ids = torch.randint(0, 50_000, (batch, depth_limit, width), generator=gen)
    return lp, ids


def heap_batch(lp, ids, budget, cap, roots):
    trees = [build_tree_heap(lp[b].tolist(), ids[b].tolist(), budget, cap) for b in range(lp.shape[0])]
    return trees, heap_trees_to_batch(trees, budget, roots)


def describe_mismatch(a: DDTreeBatch, b: DDTreeBatch) -> str:
    for r in range(a.batch_size):
        if a.request(r) != b.request(r):
            return f"request {r}:\n batched {a.request(r)}\n heap    {b.request(r)}"
    return "num_nodes or padding differ"


# --- heap semantics ------------------------------------------------------------------------


def test_heap_small_example_by_hand():
    lp = [[-0.1, -2.0], [-0.2, -0.3]]
    ids = [[10, 11], [20, 21]]
    tree = build_tree_heap(lp, ids, budget=4)
    # (0,)=-0.1, (0,0)=-0.3, (0,1)=-0.4, (1,)=-2.0, (1,0)=-2.2 ...
    assert tree.rank_tuples == [(0,), (0, 0), (0, 1), (1,)]
    assert tree.tokens == [10, 20, 21, 11]
    assert tree.parents == [0, 1, 1, 0]
    assert tree.depths == [1, 2, 2, 1]
    assert tree.ranks == [0, 0, 1, 1]
    assert tree.scores == [f32(-0.1), f32(f32(-0.1) + f32(-0.2)), f32(f32(-0.1) + f32(-0.3)), -2.0]


def test_heap_ties_prefer_smaller_rank_tuple_and_parents_first():
    # Every log-prob is 0: all scores tie, so the order is purely lexicographic on rank tuples,
    # with a prefix before its extensions.
    lp = [[0.0, 0.0, 0.0]] * 3
    ids = [[1, 2, 3]] * 3
    tree = build_tree_heap(lp, ids, budget=8)
    assert tree.rank_tuples == [(0,), (0, 0), (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1), (0, 1, 0), (0, 1, 1)]


def test_heap_matches_brute_force_enumeration():
    rng = random.Random(5)
    for _ in range(60):
        depth_limit, width = rng.randint(1, 3), rng.randint(1, 4)
        cap = rng.choice([None, 1, 2, 3])
        if rng.random() < 0.5:
            lp = [
                sorted((rng.choice([0.0, -0.5, -1.0, -2.0]) for _ in range(width)), reverse=True)
                for _ in range(depth_limit)
            ]
        else:
            lp = [sorted((math.log(rng.random()) for _ in range(width)), reverse=True) for _ in range(depth_limit)]
        ids = [[rng.randrange(1000) for _ in range(width)] for _ in range(depth_limit)]
        budget = rng.randint(0, 30)
        tree = build_tree_heap(lp, ids, budget, cap)
        got = list(zip(tree.tokens, tree.parents, tree.depths, tree.ranks))
        assert got == brute_force_tree(lp, ids, budget, cap), (lp, budget, cap)


def test_heap_budget_larger_than_tree_and_caps():
    lp = [[-0.1, -0.2, -0.3]] * 2
    ids = [[1, 2, 3]] * 2
    assert build_tree_heap(lp, ids, budget=100).num_nodes == 3 + 9
    assert build_tree_heap(lp, ids, budget=100, top_k_cap=2).num_nodes == 2 + 4
    assert build_tree_heap(lp, ids, budget=100, top_k_cap=1).num_nodes == 2
    assert build_tree_heap(lp, ids, budget=0).num_nodes == 0
    assert build_tree_heap([], [], budget=5).num_nodes == 0
    chain = build_tree_heap(lp, ids, budget=1)
    assert chain.rank_tuples == [(0,)]


def test_heap_rejects_bad_input():
    with pytest.raises(ValueError):
        build_tree_heap([[-0.1, float("nan")]], [[1, 2]], 2)
    with pytest.raises(ValueError):
        build_tree_heap([[-0.1]], [[1, 2]], 2)
    with pytest.raises(ValueError):
        build_tree_heap([[-0.1]], [[1]], -1)
    with pytest.raises(ValueError):
        build_tree_heap([[-0.1]], [[1]], 1, top_k_cap=0)


def test_f32_rounds_like_torch():
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(2000, generator=gen) * torch.logspace(-8, 3, 2000)
    b = -torch.rand(2000, generator=gen) * torch.logspace(-8, 3, 2000).flip(0)
    got = torch.tensor([f32(x + y) for x, y in zip(a.tolist(), b.tolist())], dtype=torch.float32)
    assert torch.equal(got.view(torch.int32), (a + b).view(torch.int32))


# --- batched == heap -----------------------------------------------------------------------

SHAPES = [
    # batch, L, K, budget, cap
    (1, 1, 1, 1, None),
    (1, 1, 1, 5, None),
    (3, 1, 4, 3, None),
    (2, 4, 1, 8, None),
    (4, 3, 3, 1, None),
    (4, 3, 3, 0, None),
    (5, 4, 4, 16, None),
    (5, 4, 4, 16, 2),
    (3, 5, 6, 64, 3),
    (2, 3, 3, 200, None),  # budget > all possible nodes (3 + 9 + 27)
    (2, 3, 4, 200, 2),
    (6, 7, 8, 64, None),
    (2, 15, 16, 32, None),  # DFlash-like block
    (1, 15, 64, 64, None),  # two key words (7 bits x 15 levels)
    (2, 10, 300, 40, None),  # wide ranks: 9-bit fields
]


@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
@pytest.mark.parametrize("batch,depth_limit,width,budget,cap", SHAPES)
def test_batched_equals_heap(batch, depth_limit, width, budget, cap, ties):
    seed = zlib.crc32(repr((batch, depth_limit, width, budget, cap, ties)).encode())
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        lp, ids = random_inputs(gen, batch, depth_limit, width, ties)
        roots = torch.randint(0, 50_000, (batch,), generator=gen)
        got = build_tree_batched(lp, ids, budget, top_k_cap=cap, root_tokens=roots)
        _, want = heap_batch(lp, ids, budget, cap, roots)
        assert got.equals(want), describe_mismatch(got, want)


def test_batched_equals_heap_randomized_sweep():
    gen = torch.Generator().manual_seed(11)
    rng = random.Random(11)
    for _ in range(120):
        batch, depth_limit, width = rng.randint(1, 5), rng.randint(1, 6), rng.randint(1, 7)
        budget = rng.choice([0, 1, 2, 3, 7, 16, 33, 100])
        cap = rng.choice([None, None, 1, 2, 4, 10])
        lp, ids = random_inputs(gen, batch, depth_limit, width, ties=rng.random() < 0.5)
        got = build_tree_batched(lp, ids, budget, top_k_cap=cap)
        _, want = heap_batch(lp, ids, budget, cap, None)
        assert got.equals(want), describe_mismatch(got, want)


def test_batched_handles_infinite_log_probs():
    # -inf log-probs (masked vocabulary) are still valid, poppable nodes, tied among themselves.
    lp = torch.tensor(
        [[[0.0, -1.0, float("-inf"), float("-inf")], [-0.5, float("-inf"), float("-inf"), float("-inf")]]]
    )
    ids = torch.arange(8).reshape(1, 2, 4)
    got = build_tree_batched(lp, ids, 12)
    _, want = heap_batch(lp, ids, 12, None, None)
    assert got.equals(want), describe_mismatch(got, want)
    assert int(got.num_nodes[0]) == 12


def test_tree_invariants():
    gen = torch.Generator().manual_seed(2)
    lp, ids = random_inputs(gen, 8, 6, 5, ties=True)
    tree = build_tree_batched(lp, ids, 50, root_tokens=torch.full((8,), 7))
    n = tree.num_slots
    for b in range(tree.batch_size):
        req = tree.request(b)
        count = int(tree.num_nodes[b])
        assert req["tokens"][0] == 7 and req["parents"][0] == -1 and req["depths"][0] == 0
        for i in range(1, count + 1):
            p = req["parents"][i]
            assert 0 <= p < i, "a parent precedes its child"
            assert req["depths"][i] == req["depths"][p] + 1
            assert req["scores"][i] <= req["scores"][i - 1], "scores never increase along pop order"
            assert req["tokens"][i] == int(ids[b, req["depths"][i] - 1, req["ranks"][i]])
        # padding
        assert tree.parents[b, count + 1 :].eq(-1).all() and tree.depths[b, count + 1 :].eq(0).all()
        assert tree.tokens[b, count + 1 :].eq(0).all() and tree.ranks[b, count + 1 :].eq(-1).all()
        assert torch.isneginf(tree.scores[b, count + 1 :]).all()
    assert tree.tokens.dtype == torch.int64 and tree.parents.dtype == torch.int32
    assert tree.depths.dtype == torch.int32 and tree.ranks.dtype == torch.int32
    assert tree.scores.dtype == torch.float32 and tree.num_nodes.dtype == torch.int32
    assert tree.tokens.shape == (8, n) == (8, 51)


def test_equality_check_detects_a_swapped_tie():
    # The comparison used above must notice a tie broken the other way.
    lp = torch.zeros(1, 2, 2)
    ids = torch.tensor([[[1, 2], [3, 4]]])
    tree = build_tree_batched(lp, ids, 3)
    assert tree.request(0)["tokens"] == [0, 1, 3, 4]  # (0,), (0,0), (0,1)
    swapped = DDTreeBatch(
        tree.tokens[:, [0, 1, 3, 2]],
        tree.parents,
        tree.depths,
        tree.ranks[:, [0, 1, 3, 2]],
        tree.scores,
        tree.num_nodes,
    )
    assert not swapped.equals(tree)


def test_rank_key_layout():
    assert rank_key_layout(15, 16) == (5, 12, 2)
    assert rank_key_layout(15, 8) == (4, 15, 1)
    assert rank_key_layout(1, 1) == (1, 63, 1)


# --- draft_topk ----------------------------------------------------------------------------


def test_draft_topk_values_and_ties():
    logits = torch.tensor([[[1.0, 3.0, 3.0, 0.0, 3.0]], [[0.0, 0.0, 0.0, 0.0, 5.0]]])  # [2, 1, 5]
    lp, ids = draft_topk(logits, 3)
    assert lp.dtype == torch.float32 and ids.dtype == torch.int64 and lp.shape == (2, 1, 3)
    assert ids[0, 0].tolist() == [1, 2, 4]  # equal log-probs: smaller token id first
    assert ids[1, 0].tolist() == [4, 0, 1]
    assert torch.allclose(lp, torch.log_softmax(logits, -1).gather(-1, ids))
    assert (lp[..., :-1] >= lp[..., 1:]).all()
    lp_t, _ = draft_topk(logits, 3, temperature=0.5)
    assert torch.allclose(lp_t, torch.log_softmax(logits / 0.5, -1).gather(-1, ids))
    lp_all, ids_all = draft_topk(logits, 99)
    assert lp_all.shape == (2, 1, 5)
    fast_lp, _ = draft_topk(logits, 2, stable=False)
    assert torch.equal(fast_lp, lp[..., :2])


def test_draft_topk_feeds_builder():
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 5, 40, generator=gen).to(torch.bfloat16)  # bf16: many exact ties
    lp, ids = draft_topk(logits, 8)
    got = build_tree_batched(lp, ids, 24)
    _, want = heap_batch(lp, ids, 24, None, None)
    assert got.equals(want), describe_mismatch(got, want)


# --- on a GPU, when there is one ----------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
def test_batched_on_cuda_equals_heap(ties):
    gen = torch.Generator().manual_seed(21)
    for batch, depth_limit, width, budget, cap in SHAPES + [(64, 15, 64, 64, None), (32, 15, 16, 256, 8)]:
        lp, ids = random_inputs(gen, batch, depth_limit, width, ties)
        roots = torch.randint(0, 50_000, (batch,), generator=gen)
        got = build_tree_batched(lp.cuda(), ids.cuda(), budget, top_k_cap=cap, root_tokens=roots.cuda())
        assert got.device.type == "cuda"
        got = got.to("cpu")
        _, want = heap_batch(lp, ids, budget, cap, roots)
        assert got.equals(want), describe_mismatch(got, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_draft_topk_on_cuda_equals_cpu():
    gen = torch.Generator().manual_seed(22)
    logits = torch.randn(8, 15, 5000, generator=gen).to(torch.bfloat16)  # many exact ties
    lp_cpu, ids_cpu = draft_topk(logits, 64)
    lp_gpu, ids_gpu = draft_topk(logits.cuda(), 64)
    assert torch.equal(ids_cpu, ids_gpu.cpu())
    assert torch.allclose(lp_cpu, lp_gpu.cpu(), atol=1e-5)
