"""Verify inputs (positions, masks, SGLang links) and the greedy walk, against hand-written
semantics and against SGLang 0.5.23's own Triton kernels."""

from __future__ import annotations

import random

import pytest
import torch

from sglang_overlay.core.tree import build_tree_batched
from sglang_overlay.core.verify import (
    ancestor_mask,
    eagle_verify_links,
    prefix_tree_mask,
    sglang_tree_mask,
    verify_positions,
)
from sglang_overlay.core.walk import walk_tree

from . import _sglang_kernels
from .trees import naive_walk, random_tree_batch, walk_friendly_targets

CASES = [
    # batch, L, K, budget
    (1, 1, 1, 0),
    (1, 1, 1, 1),
    (3, 2, 2, 6),
    (4, 3, 3, 12),
    (5, 4, 4, 20),
    (2, 6, 3, 40),
    (3, 15, 8, 64),
]


def naive_links(tree, b):
    req = tree.request(b)
    n = tree.num_slots
    parents = tree.parents[b].tolist()
    next_token, next_sibling = [], []
    for i in range(n):
        kids = [k for k in range(n) if parents[k] == i]
        next_token.append(min(kids) if kids else -1)
        sibs = [k for k in range(i + 1, n) if parents[i] >= 0 and parents[k] == parents[i]]
        next_sibling.append(min(sibs) if sibs else -1)
    assert len(req["parents"]) == int(tree.num_nodes[b]) + 1
    return next_token, next_sibling


@pytest.mark.parametrize("batch,depth_limit,width,budget", CASES)
def test_positions_and_masks(batch, depth_limit, width, budget):
    rng = random.Random(batch * 1000 + budget)
    tree = random_tree_batch(rng, batch, depth_limit, width, budget)
    n = tree.num_slots
    starts = torch.tensor([rng.randrange(100) for _ in range(batch)])
    pos = verify_positions(tree, starts)
    assert pos.dtype == torch.int64
    assert torch.equal(pos, starts[:, None] + tree.depths.long())
    assert torch.equal(verify_positions(tree, 7), 7 + tree.depths.long())

    mask = ancestor_mask(tree)
    assert mask.shape == (batch, n, n) and mask.dtype == torch.bool
    for b in range(batch):
        parents = tree.parents[b].tolist()
        for i in range(n):
            want = {i}
            j = parents[i]
            while j >= 0:
                want.add(j)
                j = parents[j]
            assert set(torch.nonzero(mask[b, i]).flatten().tolist()) == want, (b, i)
            assert int(mask[b, i].sum()) == int(tree.depths[b, i]) + 1

    full = prefix_tree_mask(tree, 5)
    assert full.shape == (batch, n, 5 + n) and full[:, :, :5].all() and torch.equal(full[:, :, 5:], mask)

    seq_lens = torch.tensor([rng.randrange(4) for _ in range(batch)])
    flat = sglang_tree_mask(tree, seq_lens)
    offset = 0
    for b in range(batch):
        rows = flat[offset : offset + n * (int(seq_lens[b]) + n)].reshape(n, -1)
        assert rows[:, : int(seq_lens[b])].all() and torch.equal(rows[:, int(seq_lens[b]) :], mask[b])
        offset += n * (int(seq_lens[b]) + n)
    assert offset == flat.numel()
    assert torch.equal(sglang_tree_mask(tree, seq_lens, full=False), mask.reshape(-1))


@pytest.mark.parametrize("batch,depth_limit,width,budget", CASES)
def test_eagle_links_semantics(batch, depth_limit, width, budget):
    rng = random.Random(batch * 7 + budget)
    tree = random_tree_batch(rng, batch, depth_limit, width, budget)
    links = eagle_verify_links(tree)
    n = tree.num_slots
    for t in (links.retrive_index, links.retrive_next_token, links.retrive_next_sibling):
        assert t.dtype == torch.int64 and t.shape == (batch, n)
    assert torch.equal(links.retrive_index, torch.arange(batch * n).reshape(batch, n))
    for b in range(batch):
        next_token, next_sibling = naive_links(tree, b)
        assert links.retrive_next_token[b].tolist() == next_token
        assert links.retrive_next_sibling[b].tolist() == next_sibling


def links_walk(tree, links, target, b):
    """Walk by SGLang's links (first child, then siblings), as verify_tree_greedy does."""
    n = tree.num_slots
    path, cur = [0], 0
    while True:
        want = int(target[b, cur])
        k = int(links.retrive_next_token[b, cur])
        while k != -1 and int(tree.tokens[b, k]) != want:
            k = int(links.retrive_next_sibling[b, k])
        if k == -1:
            return path, want
        assert int(links.retrive_index[b, k]) == b * n + k
        path.append(k)
        cur = k


@pytest.mark.parametrize("batch,depth_limit,width,budget", CASES)
def test_greedy_walk_matches_hand_walk_and_links(batch, depth_limit, width, budget):
    rng = random.Random(batch * 31 + budget)
    tree = random_tree_batch(rng, batch, depth_limit, width, budget)
    links = eagle_verify_links(tree)
    for _ in range(5):
        target = walk_friendly_targets(rng, tree)
        walk = walk_tree(tree, target, max_depth=depth_limit)
        assert walk.path_slots.shape == (batch, depth_limit + 1)
        for b in range(batch):
            path, bonus = naive_walk(tree, target, b)
            assert links_walk(tree, links, target, b) == (path, bonus)
            m = len(path) - 1
            assert int(walk.accept_len[b]) == m
            assert walk.path_slots[b].tolist() == path + [-1] * (depth_limit - m)
            assert int(walk.bonus[b]) == bonus
            toks = [int(tree.tokens[b, s]) for s in path[1:]]
            assert walk.accepted_tokens[b].tolist() == toks + [-1] * (depth_limit - m)
            assert walk.emitted_tokens[b].tolist() == toks + [bonus] + [-1] * (depth_limit - m)


def test_walk_takes_smallest_slot_on_duplicate_child_tokens():
    # Two children of the root carry token 5 (duplicate ids in a top-k row).
    lp = torch.tensor([[[-0.1, -0.2, -0.3]]])
    ids = torch.tensor([[[7, 5, 5]]])
    tree = build_tree_batched(lp, ids, 3)
    walk = walk_tree(tree, torch.tensor([[5, 1, 1, 1]]))
    assert walk.path_slots[0].tolist() == [0, 2] and int(walk.bonus[0]) == 1


def test_walk_never_enters_padding():
    # Padding slots have token 0 and parent -1; a target token 0 at the root must not match them.
    lp = torch.tensor([[[-0.1]]])
    ids = torch.tensor([[[3]]])
    tree = build_tree_batched(lp, ids, 5)
    assert int(tree.num_nodes[0]) == 1
    walk = walk_tree(tree, torch.zeros(1, 6, dtype=torch.int64))
    assert int(walk.accept_len[0]) == 0 and int(walk.bonus[0]) == 0


# --- against SGLang's own kernels -----------------------------------------------------------


@pytest.fixture(scope="module")
def sgl():
    kernels = _sglang_kernels.load()
    if isinstance(kernels, str):
        pytest.skip(kernels)
    return kernels


@pytest.mark.parametrize("batch,depth_limit,width,budget", CASES[1:])
def test_links_equal_sglang_reconstruct_indices_from_tree_mask(sgl, batch, depth_limit, width, budget):
    rng = random.Random(batch * 13 + budget)
    tree = random_tree_batch(rng, batch, depth_limit, width, budget)
    n = tree.num_slots
    seq_lens = torch.tensor([rng.randrange(1, 50) for _ in range(batch)], dtype=torch.int64)
    positions = torch.full((batch * n,), -7, dtype=torch.int64)
    retrive_index = torch.full((batch * n,), -7, dtype=torch.int64)
    next_token = torch.full((batch * n,), -7, dtype=torch.int64)
    next_sibling = torch.full((batch * n,), -7, dtype=torch.int64)
    sgl.reconstruct_indices_from_tree_mask(
        ancestor_mask(tree).reshape(-1).contiguous(),
        seq_lens,
        positions,
        retrive_index,
        next_token,
        next_sibling,
        batch,
        n,
    )
    links = eagle_verify_links(tree)
    assert torch.equal(positions.reshape(batch, n), verify_positions(tree, seq_lens)), sgl.how
    assert torch.equal(retrive_index.reshape(batch, n), links.retrive_index)
    assert torch.equal(next_token.reshape(batch, n), links.retrive_next_token)
    assert torch.equal(next_sibling.reshape(batch, n), links.retrive_next_sibling)


@pytest.mark.parametrize("batch,depth_limit,width,budget", CASES[1:])
def test_greedy_walk_equals_sglang_verify_tree_greedy(sgl, batch, depth_limit, width, budget):
    rng = random.Random(batch * 17 + budget)
    tree = random_tree_batch(rng, batch, depth_limit, width, budget)
    n = tree.num_slots
    links = eagle_verify_links(tree)
    spec_tokens = depth_limit + 1
    for _ in range(3):
        target = walk_friendly_targets(rng, tree)
        predicts = torch.full((batch * n,), -7, dtype=torch.int32)
        accept_index = torch.full((batch, spec_tokens), -1, dtype=torch.int32)
        accept_token_num = torch.full((batch,), -7, dtype=torch.int32)
        sgl.verify_tree_greedy(
            predicts,
            accept_index,
            accept_token_num,
            tree.tokens.contiguous(),
            links.retrive_index,
            links.retrive_next_token,
            links.retrive_next_sibling,
            target.contiguous(),
        )
        walk = walk_tree(tree, target, max_depth=depth_limit)
        assert accept_token_num.tolist() == walk.accept_len.tolist()
        base = torch.arange(batch)[:, None] * n
        want_index = torch.where(walk.path_slots >= 0, base + walk.path_slots, -1)
        assert torch.equal(accept_index.long(), want_index)
        for b in range(batch):
            m = int(walk.accept_len[b])
            rows = [b * n + int(s) for s in walk.path_slots[b, : m + 1]]
            assert predicts[rows].tolist() == walk.emitted_tokens[b, : m + 1].tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_verify_inputs_and_walk_on_cuda_equal_cpu():
    rng = random.Random(99)
    tree = random_tree_batch(rng, 16, 15, 8, 64)
    target = walk_friendly_targets(rng, tree)
    gpu = tree.to("cuda")
    assert torch.equal(ancestor_mask(gpu).cpu(), ancestor_mask(tree))
    links_cpu, links_gpu = eagle_verify_links(tree), eagle_verify_links(gpu)
    for name in ("retrive_index", "retrive_next_token", "retrive_next_sibling"):
        assert torch.equal(getattr(links_gpu, name).cpu(), getattr(links_cpu, name))
    walk_cpu, walk_gpu = walk_tree(tree, target, 15), walk_tree(gpu, target.cuda(), 15)
    assert torch.equal(walk_gpu.emitted_tokens.cpu(), walk_cpu.emitted_tokens)
    assert torch.equal(walk_gpu.path_slots.cpu(), walk_cpu.path_slots)
