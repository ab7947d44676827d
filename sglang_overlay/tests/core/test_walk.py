"""Verification walks: exactness at T = 0 and T > 0 (with broken rules as controls), kv_keep and
the compaction plan."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from broken_rules import accept_drafter_token
from ddtree_stats import ALPHA, chi_square_fit

from sglang_overlay.core.tree import DDTreeBatch, build_tree_batched, draft_topk
from sglang_overlay.core.walk import (
    WalkResult,
    compaction_plan,
    greedy_walk,
    kv_keep,
    sample_target_tokens,
    sampled_walk,
    walk_tree,
)

from .trees import random_tree_batch, walk_friendly_targets

# A Markov ("bigram") target over a small vocabulary: the target's logits after a path depend on
# its last token only, so the exact distribution of any continuation is a product of table rows,
# and one batched call verifies thousands of independent requests.
VOCAB = 6
DEPTH = 3
K = 3
BUDGET = 7
ROOT = 2
TOKENS_CHECKED = 3  # the joint distribution of the first 3 tokens a step yields: 216 cells


def bigram_table(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(VOCAB, VOCAB, generator=gen) * 1.5


def make_trees(table: torch.Tensor, batch: int, seed: int) -> DDTreeBatch:
    """Trees from a decent drafter: the target's greedy chain from the root, plus noise.

    The drafter depends on the target's table but never on the target's samples of this step.
    """
    gen = torch.Generator().manual_seed(seed)
    chain, prev = [], ROOT
    for _ in range(DEPTH):
        chain.append(table[prev])
        prev = int(table[prev].argmax())
    draft_logits = torch.stack(chain)[None] + 1.0 * torch.randn(batch, DEPTH, VOCAB, generator=gen)
    lp, ids = draft_topk(draft_logits, K)
    return build_tree_batched(lp, ids, BUDGET, root_tokens=torch.full((batch,), ROOT))


def continue_ar(table: torch.Tensor, walk: WalkResult, temperature: float, gen: torch.Generator) -> torch.Tensor:
    """The first TOKENS_CHECKED tokens: those the step emitted, then exact AR samples from the target."""
    batch = walk.bonus.shape[0]
    out = torch.full((batch, TOKENS_CHECKED), -1, dtype=torch.int64)
    emitted = walk.emitted_tokens
    take = min(TOKENS_CHECKED, emitted.shape[1])
    out[:, :take] = emitted[:, :take]
    rows = torch.arange(batch)
    num = walk.num_emitted.clamp(max=TOKENS_CHECKED)
    for j in range(1, TOKENS_CHECKED):
        need = num <= j
        prev = out[:, j - 1]
        probs = torch.softmax(table[prev] / temperature, dim=-1)
        draw = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        out[rows, j] = torch.where(need, draw, out[rows, j])
    return out


def exact_joint(table: torch.Tensor, temperature: float) -> np.ndarray:
    p = torch.softmax(table.double() / temperature, dim=-1).numpy()
    # joint[a, b, c] = p(a | root) p(b | a) p(c | b)
    return np.einsum("a,ab,bc->abc", p[ROOT], p, p)


def run_walks(walk_fn, temperature: float, seed: int, batch: int = 20_000) -> np.ndarray:
    table = bigram_table(seed)
    tree = make_trees(table, batch, seed + 1)
    target_logits = table[tree.tokens]  # [B, n, V]: the target's logits after each slot
    gen = torch.Generator().manual_seed(seed + 2)
    walk = walk_fn(tree, target_logits, temperature, gen)
    seqs = continue_ar(table, walk, temperature, gen)
    assert (seqs >= 0).all()
    flat = seqs[:, 0] * VOCAB * VOCAB + seqs[:, 1] * VOCAB + seqs[:, 2]
    counts = np.bincount(flat.numpy(), minlength=VOCAB**3).reshape(VOCAB, VOCAB, VOCAB)
    return counts, exact_joint(table, temperature), walk.accept_len


# --- the rule under test and broken controls ------------------------------------------------


def correct_rule(tree, logits, temperature, gen):
    return sampled_walk(tree, logits, temperature, gen)


def shared_uniform(tree, logits, temperature, gen):
    """BROKEN (subtle): every slot of a request reuses one uniform draw (inverse-CDF sampling).

    Each token on its own still follows the target's conditional; their joint does not.
    """
    probs = torch.softmax(logits / temperature, dim=-1)
    u = torch.rand(tree.batch_size, 1, 1, generator=gen)
    tokens = (probs.cumsum(-1) < u).sum(-1).clamp(max=probs.shape[-1] - 1)
    return walk_tree(tree, tokens)


def argmax_at_temperature(tree, logits, temperature, gen):
    """BROKEN: greedy acceptance at T > 0."""
    return greedy_walk(tree, logits)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("seed", [0, 100])
def test_sampled_walk_keeps_the_target_distribution(temperature, seed):
    counts, probs, accept_len = run_walks(correct_rule, temperature, seed)
    fit = chi_square_fit(counts, probs)
    assert fit.p_value > ALPHA, str(fit)
    # The walks really went into the trees, down to the bottom at times.
    assert float(accept_len.float().mean()) > 0.5 and int(accept_len.max()) == DEPTH


@pytest.mark.parametrize("broken", [accept_drafter_token, shared_uniform, argmax_at_temperature])
def test_broken_rules_fail_the_same_test(broken):
    counts, probs, _ = run_walks(broken, 1.0, 0)
    fit = chi_square_fit(counts, probs)
    assert fit.p_value < ALPHA, f"{broken.__name__} was not detected: {fit}"


def test_sampling_is_reproducible_with_a_generator():
    table = bigram_table(3)
    tree = make_trees(table, 50, 3)
    logits = table[tree.tokens]
    a = sampled_walk(tree, logits, 1.0, torch.Generator().manual_seed(9))
    b = sampled_walk(tree, logits, 1.0, torch.Generator().manual_seed(9))
    c = sampled_walk(tree, logits, 1.0, torch.Generator().manual_seed(10))
    assert torch.equal(a.emitted_tokens, b.emitted_tokens)
    assert not torch.equal(a.emitted_tokens, c.emitted_tokens)
    with pytest.raises(ValueError):
        sample_target_tokens(logits, 0.0)


def test_greedy_walk_follows_the_target_argmax_chain():
    table = bigram_table(5)
    tree = make_trees(table, 500, 6)
    walk = greedy_walk(tree, table[tree.tokens])
    for b in range(tree.batch_size):
        m = int(walk.accept_len[b])
        prev, chain = ROOT, []
        for _ in range(m + 1):
            prev = int(table[prev].argmax())
            chain.append(prev)
        assert walk.emitted_tokens[b, : m + 1].tolist() == chain
    assert int(walk.accept_len.max()) == DEPTH  # some walks reach the bottom


# --- kv_keep and compaction ------------------------------------------------------------------


def test_kv_keep_and_compaction_plan():
    rng = random.Random(8)
    tree = random_tree_batch(rng, 6, 5, 3, 30)
    walk = walk_tree(tree, walk_friendly_targets(rng, tree), max_depth=5)
    keep, num_keep = kv_keep(walk)
    assert torch.equal(num_keep, walk.accept_len + 1)
    assert torch.equal(keep, walk.path_slots)
    base = torch.tensor([0, 3, 10, 10, 50, 7])
    plan = compaction_plan(walk, base)

    # Simulate a KV window: row r holds the value r; apply the plan in increasing j, in place.
    for b in range(tree.batch_size):
        rows = list(range(int(base[b]) + tree.num_slots))
        m = int(plan.num_keep[b])
        for j in range(plan.src.shape[1]):
            if plan.move[b, j]:
                rows[int(plan.dst[b, j])] = rows[int(plan.src[b, j])]
        rows = rows[: int(base[b]) + m]
        want = list(range(int(base[b]))) + [int(base[b]) + int(s) for s in walk.path_slots[b, :m]]
        assert rows == want
        assert plan.valid[b].tolist() == [j < m for j in range(plan.src.shape[1])]
        assert (plan.src[b, m:] == -1).all() and (plan.dst[b, m:] == -1).all()
        assert not plan.move[b, 0]  # the root is already in place


def test_compaction_plan_scalar_base():
    lp = torch.tensor([[[-0.1, -0.2], [-0.1, -0.2]]])
    ids = torch.tensor([[[1, 2], [3, 4]]])
    tree = build_tree_batched(lp, ids, 6)
    # (0,)=-0.1; (0,0) and (1,) tie at -0.2 -> (0,0) first; (0,1) and (1,0) tie at -0.3.
    assert tree.request(0)["tokens"] == [0, 1, 3, 2, 4, 3, 4]
    assert tree.request(0)["parents"] == [-1, 0, 1, 0, 1, 3, 3]
    walk = walk_tree(tree, torch.tensor([[2, 9, 9, 4, 9, 9, 9]]))
    assert walk.path_slots[0].tolist() == [0, 3, 6] and int(walk.bonus[0]) == 9
    plan = compaction_plan(walk, 100)
    assert plan.src[0].tolist() == [100, 103, 106] and plan.dst[0].tolist() == [100, 101, 102]
    assert plan.move[0].tolist() == [False, True, True]
