"""The worker's tensor glue against the core and against SGLang 0.5.23's own Triton kernels."""

from __future__ import annotations

import pytest
import torch

from sglang_overlay.adapter import tree_verify
from sglang_overlay.adapter.tree_verify import (
    accepted_step,
    build_tree_verify_tensors,
    dense_head_topk,
    full_custom_mask,
    merge_shard_topk,
    pad_tree,
    shard_topk_partial,
    vocab_parallel_head_topk,
)
from sglang_overlay.core.tree import build_tree_batched, draft_topk
from sglang_overlay.core.verify import ancestor_mask, sglang_tree_mask
from sglang_overlay.core.walk import walk_tree


def random_draft(bs: int, depth: int, k: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, depth, vocab, generator=g) * 3
    return draft_topk(logits, k)


@pytest.fixture(scope="module")
def sgl():
    from core import _sglang_kernels  # the core tests' loader of SGLang's own kernels

    kernels = _sglang_kernels.load()
    if isinstance(kernels, str):
        pytest.skip(kernels)
    return kernels


# ---- layout -------------------------------------------------------------------------------


def test_pad_tree_adds_unreachable_padding():
    lp, ids = random_draft(2, 4, 3, 50, seed=1)
    tree = build_tree_batched(lp, ids, 5, root_tokens=torch.tensor([7, 9]))
    padded = pad_tree(tree, 9)
    assert padded.num_slots == 9 and torch.equal(padded.num_nodes, tree.num_nodes)
    assert torch.equal(padded.tokens[:, :6], tree.tokens)
    assert (padded.parents[:, 6:] == -1).all() and (padded.depths[:, 6:] == 0).all()
    with pytest.raises(ValueError):
        pad_tree(tree, 5)


def test_verify_tensors_layout():
    bs, depth, k, window = 3, 5, 3, 8
    lp, ids = random_draft(bs, depth, k, 40, seed=2)
    roots = torch.tensor([11, 12, 13])
    prefix = torch.tensor([3, 0, 5])
    t = build_tree_verify_tensors(lp, ids, roots, prefix, budget=6, top_k=k, window=window)
    tree = t.tree
    assert tree.num_slots == window and t.draft_token.shape == (bs * window,)
    assert torch.equal(t.draft_token.view(bs, window)[:, 0], roots)
    assert torch.equal(t.positions.view(bs, window), prefix[:, None] + tree.depths.long())
    # FULL mask: per request `window` rows of prefix + window columns.
    assert torch.equal(t.custom_mask, sglang_tree_mask(tree, prefix, full=True))
    assert t.custom_mask.numel() == int((prefix + window).sum()) * window
    # Row of the deepest node of request 2: prefix visible, then exactly its ancestors + itself.
    b = 2
    node = int(tree.depths[b].argmax())
    offset = sum(int(p + window) * window for p in prefix[:b])
    row = t.custom_mask[offset + node * int(prefix[b] + window) : offset + (node + 1) * int(prefix[b] + window)]
    assert row[: int(prefix[b])].all()
    chain, cur = set(), node
    while cur >= 0:
        chain.add(cur)
        cur = int(tree.parents[b, cur])
    assert {j for j in range(window) if row[int(prefix[b]) + j]} == chain


def test_full_custom_mask_uses_host_lengths_when_given():
    lp, ids = random_draft(2, 3, 2, 20, seed=3)
    tree = pad_tree(build_tree_batched(lp, ids, 4), 6)
    prefix = torch.tensor([2, 7])
    anc = ancestor_mask(tree)
    assert torch.equal(full_custom_mask(anc, prefix, prefix.clone()), full_custom_mask(anc, prefix))
    assert torch.equal(full_custom_mask(anc, prefix), sglang_tree_mask(tree, prefix, full=True))


def test_the_mask_size_bound_covers_the_mask_from_host_data_alone(monkeypatch):
    # The worker sizes the FULL mask from SGLang's reserved lengths (prefix + window at least) so
    # that no step waits for the device: the first exact-size entries are the exact mask (the
    # backend finds each request's rows through mask_indptr, from the device lengths), the rest True
    # and unread; no prefix exceeds the context, so the bound stays within SGLang's graph buffer.
    window, context = 6, 40
    lp, ids = random_draft(3, window, 2, 20, seed=5)
    prefix = torch.tensor([2, 7, 33])
    layout = tree_verify.tree_layout(lp, ids, torch.tensor([1, 2, 3]), prefix, budget=4, top_k=2, window=window)
    exact = full_custom_mask(layout.ancestors, prefix)
    reserved = prefix + window + torch.tensor([0, 5, 20])  # the last one past context + window
    bound = tree_verify.full_mask_size_bound(reserved, window, context)
    assert bound == window * (8 + 18 + context + window)
    assert exact.numel() <= bound <= 3 * window * (context + window)

    def no_exact_size(*args):
        raise AssertionError("the exact size needs the device lengths: a host sync")

    monkeypatch.setattr(tree_verify, "full_mask_size", no_exact_size)
    mask = tree_verify.verify_tensors_from_layout(layout, prefix, None, bound).custom_mask
    assert mask.numel() == bound
    assert torch.equal(mask[: exact.numel()], exact)
    assert bool(mask[exact.numel() :].all())


def test_budget_must_fit_the_window():
    lp, ids = random_draft(1, 4, 2, 10, seed=4)
    with pytest.raises(ValueError, match="window"):
        build_tree_verify_tensors(lp, ids, torch.tensor([1]), torch.tensor([0]), budget=8, top_k=2, window=8)


# ---- against SGLang's kernels -------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_links_and_positions_equal_sglangs_reconstruction(sgl, seed):
    bs, depth, k, window = 3, 6, 3, 10
    lp, ids = random_draft(bs, depth, k, 30, seed=seed)
    prefix = torch.tensor([4, 1, 9])
    t = build_tree_verify_tensors(lp, ids, torch.tensor([1, 2, 3]), prefix, budget=7, top_k=k, window=window)
    qlen_mask = ancestor_mask(t.tree).reshape(-1).contiguous()
    positions = torch.empty(bs * window, dtype=torch.int64)
    r_index = torch.empty((bs, window), dtype=torch.int64)
    r_next = torch.empty_like(r_index)
    r_sib = torch.empty_like(r_index)
    sgl.reconstruct_indices_from_tree_mask(qlen_mask, prefix, positions, r_index, r_next, r_sib, bs, window)
    assert torch.equal(positions, t.positions)
    assert torch.equal(r_index, t.retrieve_index)
    assert torch.equal(r_next, t.retrieve_next_token)
    assert torch.equal(r_sib, t.retrieve_next_sibling)


def _targets_following_the_tree(tree, follow: float, seed: int, vocab: int) -> torch.Tensor:
    """Target tokens per slot: often a child's token (so paths get accepted), else random."""
    g = torch.Generator().manual_seed(seed)
    bs, n = tree.tokens.shape
    out = torch.randint(0, vocab, (bs, n), generator=g)
    for b in range(bs):
        for slot in range(n):
            children = [c for c in range(n) if int(tree.parents[b, c]) == slot and c <= int(tree.num_nodes[b])]
            if children and float(torch.rand((), generator=g)) < follow:
                pick = children[int(torch.randint(0, len(children), (), generator=g))]
                out[b, slot] = tree.tokens[b, pick]
    return out


@pytest.mark.parametrize("seed", range(6))
def test_sglang_greedy_acceptance_equals_the_core_walk(sgl, seed):
    bs, depth, k, window, vocab = 4, 7, 3, 12, 25
    lp, ids = random_draft(bs, depth, k, vocab, seed=100 + seed)
    prefix = torch.tensor([5, 0, 2, 8])
    roots = torch.tensor([3, 4, 5, 6])
    budget = [11, 6, 9, 1][seed % 4]
    t = build_tree_verify_tensors(lp, ids, roots, prefix, budget=budget, top_k=k, window=window)
    target = _targets_following_the_tree(t.tree, follow=0.8, seed=seed, vocab=vocab)

    # SGLang's verify_tree_greedy on our links, as eagle_sample calls it.
    predict = torch.zeros(bs * window, dtype=torch.int32)
    accept_index = torch.full((bs, window), -1, dtype=torch.int32)
    num_correct = torch.empty(bs, dtype=torch.int32)
    sgl.verify_tree_greedy(
        predict,
        accept_index,
        num_correct,
        t.draft_token.view(bs, window),
        t.retrieve_index,
        t.retrieve_next_token,
        t.retrieve_next_sibling,
        target,
    )
    walk = walk_tree(t.tree, target, max_depth=window - 1)
    assert torch.equal(num_correct.long(), walk.accept_len)
    for b in range(bs):
        n = int(walk.accept_len[b]) + 1
        assert accept_index[b, :n].tolist() == [b * window + int(s) for s in walk.path_slots[b, :n]]
        assert (accept_index[b, n:] == -1).all()

    step = accepted_step(predict, accept_index, num_correct + 1, prefix)
    assert torch.equal(step.accept_lens.long(), walk.accept_len + 1)
    assert torch.equal(step.bonus, walk.bonus)
    for b in range(bs):
        n = int(step.accept_lens[b])
        assert step.out_tokens[b, :n].tolist() == walk.emitted_tokens[b, :n].tolist()
        assert (step.out_tokens[b, n:] == 0).all()
        assert step.path_rows[b, :n].tolist() == accept_index[b, :n].tolist()
        assert ((step.path_rows[b] >= 0) & (step.path_rows[b] < bs * window)).all()
        assert step.path_positions[b, :n].tolist() == list(range(int(prefix[b]), int(prefix[b]) + n))


# ---- drafter distributions ------------------------------------------------------------------


def test_dense_head_topk_equals_draft_topk_of_the_logits():
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(9, 16, generator=g)
    weight = torch.randn(70, 16, generator=g)
    lp, ids = dense_head_topk(hidden, weight, 5, vocab_size=64, chunk_rows=4)
    ref_lp, ref_ids = draft_topk(hidden @ weight[:64].T, 5)
    assert torch.equal(ids, ref_ids)
    assert torch.allclose(lp, ref_lp, atol=1e-5)
    assert int(ids.max()) < 64  # padding rows of the head never show up


@pytest.mark.parametrize("bounds", [(0, 64), (0, 20, 64), (0, 7, 30, 64)])
def test_vocab_parallel_merge_equals_the_full_top_k(bounds):
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(6, 64, generator=g) * 2
    logits[0, 5] = logits[0, 40] = logits[0].max() + 1  # a tie across shards
    k = 4
    parts = [shard_topk_partial(logits[:, lo:hi], k, lo) for lo, hi in zip(bounds, bounds[1:])]
    values = torch.stack([p[0][:, :k] for p in parts])
    ids = torch.stack([p[1][:, :k] for p in parts])
    lse = torch.stack([p[2] for p in parts])
    lp, got_ids = merge_shard_topk(values, ids, lse, k)
    ref_lp, ref_ids = draft_topk(logits, k)
    assert torch.equal(got_ids, ref_ids)
    assert got_ids[0, :2].tolist() == [5, 40]  # ties: smaller id first, like the core
    assert torch.allclose(lp, ref_lp, atol=1e-5)


def test_vocab_parallel_head_at_tp1_takes_the_dense_path(monkeypatch):
    # SGLang's ParallelLMHead has shard_indices at TP 1 too: the whole vocabulary is one shard, so no
    # separate logsumexp + torch.topk (the partial path) runs, only dense_head_topk (the fused kernel on CUDA).
    def partial_path(*_a, **_k):
        raise AssertionError("the shard partial ran at TP 1")

    monkeypatch.setattr(tree_verify, "shard_topk_partial", partial_path)
    g = torch.Generator().manual_seed(9)
    hidden = torch.randn(7, 16, generator=g)
    weight = torch.randn(70, 16, generator=g)  # 64 real rows + 6 padding rows
    lp, ids = vocab_parallel_head_topk(hidden, weight, 5, num_org=64, vocab_start=0, world_size=1)
    ref_lp, ref_ids = draft_topk(hidden @ weight[:64].T, 5)
    assert torch.equal(ids, ref_ids)
    assert torch.allclose(lp, ref_lp, atol=1e-5)


def test_vocab_parallel_head_across_two_ranks_merges_to_the_full_top_k():
    g = torch.Generator().manual_seed(10)
    hidden = torch.randn(5, 16, generator=g)
    weight = torch.randn(64, 16, generator=g)
    k = 4
    other = shard_topk_partial(hidden @ weight[32:].T, k, 32)  # what rank 1 contributes
    pending = list(other)

    def all_gather(t):  # rank 0's [1, ...] tensor stacked with rank 1's, as tp_group.all_gather(dim=0)
        return torch.cat([t, pending.pop(0)[None]], dim=0)

    lp, ids = vocab_parallel_head_topk(
        hidden, weight[:32], k, num_org=32, vocab_start=0, world_size=2, all_gather=all_gather
    )
    ref_lp, ref_ids = draft_topk(hidden @ weight.T, k)
    assert torch.equal(ids, ref_ids)
    assert torch.allclose(lp, ref_lp, atol=1e-5)


def test_dense_head_topk_stable_breaks_ties_by_smaller_id():
    g = torch.Generator().manual_seed(8)
    hidden = torch.randn(3, 8, generator=g)
    weight = torch.randn(20, 8, generator=g)
    weight[11] = weight[4] = hidden[0] * 10  # two equal logits, far above the rest for row 0
    lp, ids = dense_head_topk(hidden, weight, 3, stable=True)
    assert ids[0, :2].tolist() == [4, 11]
    assert lp[0, 0] == lp[0, 1]
