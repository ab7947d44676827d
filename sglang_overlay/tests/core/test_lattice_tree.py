"""The tree grown from a DFlash2 selector lattice (core.lattice): the heap oracle against brute force,
the batched builder against the oracle (exactly, ties included), the reduction to the marginal
builder when the lattice carries no more than marginals, the draft q, and an offline acceptance
comparison on a synthetic Markov source."""

from __future__ import annotations

import itertools
import math
import random
import zlib

import pytest
import torch

from sglang_overlay.core.heap import f32
from sglang_overlay.core.lattice import (
    build_lattice_tree_batched,
    build_lattice_tree_heap,
    build_lattice_tree_reference,
    lattice_draft_q,
    lattice_log_probs,
    lattice_slot_candidates,
    lattice_temperatures,
)
from sglang_overlay.core.tree import DDTreeBatch, build_tree_batched, draft_topk
from sglang_overlay.core.verify import eagle_verify_links
from sglang_overlay.core.walk import sampled_walk

# --- helpers -------------------------------------------------------------------------------


def random_lattice(gen: torch.Generator, batch: int, slots: int, width: int, ties: bool):
    """``candidate_ids [B, E, K]`` (distinct per slot) and ``scores [B, E, K, K]``."""
    if ties:
        # Few distinct values: many exact ties inside rows, across rows and across slots.
        levels = torch.tensor([2.0, 0.5, 0.5, 0.0, -1.0, -4.0])
        scores = levels[torch.randint(0, len(levels), (batch, slots, width, width), generator=gen)]
    else:
        scores = torch.randn(batch, slots, width, width, generator=gen) * 2.0
    ids = torch.randperm(50_000, generator=gen)[: batch * slots * width].reshape(batch, slots, width)
    return ids, scores


def random_temperatures(gen: torch.Generator, batch: int):
    """``None``, a number, or ``[B]`` per-request temperatures (some <= 0: read as 1)."""
    kind = int(torch.randint(0, 3, (1,), generator=gen))
    if kind == 0:
        return None
    if kind == 1:
        return [0.6, 1.0, 1.7][int(torch.randint(0, 3, (1,), generator=gen))]
    return torch.tensor([0.0, 0.5, 1.0, 2.0, 0.8, -1.0])[torch.randint(0, 6, (batch,), generator=gen)]


def describe_mismatch(a: DDTreeBatch, b: DDTreeBatch) -> str:
    for r in range(a.batch_size):
        if a.request(r) != b.request(r):
            return f"request {r}:\n batched   {a.request(r)}\n reference {b.request(r)}"
    return "num_nodes or padding differ"


def brute_force_lattice_tree(cond_lp, cond_order, ids, budget, cap=None):
    """Every lattice path of every depth, scored as the rule says, sorted by (-score, rank tuple).

    Returns the sorted list of ``(-score, rank tuple, candidate path)`` over all paths.
    """
    slots, width = len(cond_lp), len(ids[0])
    cap = width if cap is None else min(cap, width)
    lp = [[[f32(v) for v in row] for row in slot] for slot in cond_lp]
    rank_of = [[{c: r for r, c in enumerate(cond_order[e][p])} for p in range(width)] for e in range(slots)]
    paths = []
    for d in range(1, slots + 1):
        for cands in itertools.product(range(width), repeat=d):
            score, ranks, row = 0.0, [], 0
            for e, c in enumerate(cands):
                r = rank_of[e][row][c]
                score = f32(score + lp[e][row][r])
                ranks.append(r)
                row = c
            if max(ranks) < cap:
                paths.append((-score, tuple(ranks), cands))
    paths.sort()
    return paths


# --- the conditional rows ----------------------------------------------------------------------


def test_lattice_log_probs_rows_temperatures_and_ties():
    scores = torch.tensor([[[[1.0, 3.0, 3.0, 0.0], [0.0, 0.0, 5.0, 0.0], [2.0, 2.0, 2.0, 2.0], [0.0, 1.0, 2.0, 3.0]]]])
    scores = torch.cat([scores, scores * 0.5], 0)  # [2, 1, 4, 4]
    lp, order = lattice_log_probs(scores)
    assert lp.dtype == torch.float32 and order.dtype == torch.int64 and lp.shape == order.shape == (2, 1, 4, 4)
    assert order[0, 0, 0].tolist() == [1, 2, 0, 3]  # equal values: smaller candidate index first
    assert order[0, 0, 2].tolist() == [0, 1, 2, 3]
    assert torch.equal(lp, torch.log_softmax(scores, -1).gather(-1, order))
    temps = torch.tensor([0.5, 0.0])  # request 1: T <= 0 reads as 1 (no scaling)
    lp_t, order_t = lattice_log_probs(scores, temps)
    assert torch.equal(lp_t[0], torch.log_softmax(scores[0] / 0.5, -1).gather(-1, order_t[0]))
    assert torch.equal(lp_t[1], lp[1]) and torch.equal(order_t[1], order[1])
    assert lattice_temperatures(None, 3).tolist() == [1.0, 1.0, 1.0]
    assert lattice_temperatures(0.0, 2).tolist() == [1.0, 1.0]
    assert lattice_temperatures(torch.tensor([0.25, -1.0]), 2).tolist() == [0.25, 1.0]
    with pytest.raises(ValueError):
        lattice_temperatures(torch.ones(3), 2)


# --- the heap oracle -----------------------------------------------------------------------


def test_heap_small_example_by_hand():
    # E = 2, K = 2. Slot 0 (given the anchor): candidate 1 is better. Slot 1: after candidate 1
    # the continuation is nearly certain (candidate 0); after candidate 0 it is a coin flip.
    half, sure, unsure = math.log(0.5), math.log(0.9), math.log(0.1)
    cond_lp = [[[math.log(0.6), math.log(0.4)], [0.0, 0.0]], [[half, half], [sure, unsure]]]
    cond_order = [[[1, 0], [0, 1]], [[0, 1], [0, 1]]]
    ids = [[10, 11], [20, 21]]
    tree = build_lattice_tree_heap(cond_lp, cond_order, ids, budget=4)
    s1 = f32(math.log(0.6))  # (0,) = candidate 1 at slot 0: 0.6
    s2 = f32(s1 + f32(sure))  # (0, 0) = 11 -> 20: 0.54
    s3 = f32(math.log(0.4))  # (1,) = candidate 0 at slot 0: 0.4
    s4 = f32(s3 + f32(half))  # (1, 0) = 10 -> 20: 0.2  (beats (0, 1) = 11 -> 21: 0.06)
    assert tree.rank_tuples == [(0,), (0, 0), (1,), (1, 0)]
    assert tree.tokens == [11, 20, 10, 20]
    assert tree.candidates == [1, 0, 0, 0]
    assert tree.parents == [0, 1, 0, 3]
    assert tree.depths == [1, 2, 1, 2]
    assert tree.ranks == [0, 0, 1, 0]
    assert tree.scores == [s1, s2, s3, s4]


def test_heap_ties_prefer_smaller_rank_tuple_and_parents_first():
    cond_lp = [[[0.0] * 3] * 3] * 3
    cond_order = [[[2, 0, 1]] * 3] * 3
    ids = [[1, 2, 3]] * 3
    tree = build_lattice_tree_heap(cond_lp, cond_order, ids, budget=8)
    assert tree.rank_tuples == [(0,), (0, 0), (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1), (0, 1, 0), (0, 1, 1)]
    assert tree.tokens[:3] == [3, 3, 3]


def test_heap_is_the_top_budget_paths_closed_under_ancestors():
    # The node set is the top-`budget` of all lattice paths by score (ties: rank tuples), in that
    # order, and it is closed under ancestors.
    rng = random.Random(5)
    gen = torch.Generator().manual_seed(5)
    for _ in range(60):
        slots, width = rng.randint(1, 3), rng.randint(1, 3)
        cap = rng.choice([None, None, 1, 2])
        ids, scores = random_lattice(gen, 1, slots, width, ties=rng.random() < 0.5)
        temp = rng.choice([None, 0.7])
        cond_lp, cond_order = (x[0].tolist() for x in lattice_log_probs(scores, temp))
        budget = rng.randint(0, 45)
        tree = build_lattice_tree_heap(cond_lp, cond_order, ids[0].tolist(), budget, cap)
        paths = brute_force_lattice_tree(cond_lp, cond_order, ids[0].tolist(), budget, cap)
        chosen = paths[:budget]
        assert tree.rank_tuples == [ranks for _, ranks, _ in chosen], (scores, budget, cap)
        assert tree.scores == [-neg for neg, _, _ in chosen]
        by_ranks = {ranks: cands for _, ranks, cands in paths}
        slot_of = {(): 0}
        for i, ranks in enumerate(tree.rank_tuples):
            assert ranks[:-1] in slot_of, "closed under ancestors"
            assert tree.parents[i] == slot_of[ranks[:-1]]
            slot_of[ranks] = i + 1
            cands = by_ranks[ranks]
            assert tree.candidates[i] == cands[-1]
            assert tree.tokens[i] == int(ids[0, len(ranks) - 1, cands[-1]])
        if budget < len(paths) and chosen:
            assert -chosen[-1][0] >= -paths[budget][0], "nothing left out scores higher"


def test_heap_rejects_bad_input():
    ok_lp, ok_order, ok_ids = [[[-0.1, -2.0], [-0.1, -2.0]]], [[[0, 1], [0, 1]]], [[1, 2]]
    assert build_lattice_tree_heap(ok_lp, ok_order, ok_ids, 2).num_nodes == 2
    with pytest.raises(ValueError):
        build_lattice_tree_heap([[[-0.1, float("nan")], [-0.1, -2.0]]], ok_order, ok_ids, 2)
    with pytest.raises(ValueError):
        build_lattice_tree_heap(ok_lp, ok_order, [[1]], 2)
    with pytest.raises(ValueError):
        build_lattice_tree_heap(ok_lp, ok_order, ok_ids, -1)
    with pytest.raises(ValueError):
        build_lattice_tree_heap(ok_lp, ok_order, ok_ids, 1, top_k_cap=0)
    with pytest.raises(ValueError):
        build_lattice_tree_batched(torch.zeros(1, 2, 3, dtype=torch.int64), torch.zeros(1, 2, 3, 2), 4)
    assert build_lattice_tree_heap([], [], [], 5).num_nodes == 0


# --- batched == reference --------------------------------------------------------------------

SHAPES = [
    # batch, E, K, budget, cap
    (1, 1, 1, 1, None),
    (1, 1, 1, 5, None),
    (3, 1, 4, 3, None),
    (2, 4, 1, 8, None),
    (4, 3, 3, 0, None),
    (4, 3, 3, 1, None),
    (5, 4, 4, 16, None),
    (5, 4, 4, 16, 2),
    (3, 5, 6, 64, 3),
    (2, 3, 3, 100, None),  # budget > all possible nodes (3 + 9 + 27)
    (6, 7, 8, 64, None),  # a DFlash2 block of 8 (anchor + 7)
    (3, 7, 8, 127, None),
    (2, 15, 8, 127, None),  # a 16-block: E = 15
    (4, 15, 5, 127, 4),
]


@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
@pytest.mark.parametrize("batch,slots,width,budget,cap", SHAPES)
def test_batched_equals_reference(batch, slots, width, budget, cap, ties):
    seed = zlib.crc32(repr((batch, slots, width, budget, cap, ties)).encode())
    gen = torch.Generator().manual_seed(seed)
    for _ in range(2):
        ids, scores = random_lattice(gen, batch, slots, width, ties)
        temp = random_temperatures(gen, batch)
        roots = torch.randint(0, 50_000, (batch,), generator=gen)
        got = build_lattice_tree_batched(ids, scores, budget, temperature=temp, top_k_cap=cap, root_tokens=roots)
        want, _ = build_lattice_tree_reference(ids, scores, budget, temperature=temp, top_k_cap=cap, root_tokens=roots)
        assert got.equals(want), describe_mismatch(got, want)


def test_batched_equals_reference_randomized_sweep():
    gen = torch.Generator().manual_seed(11)
    rng = random.Random(11)
    for _ in range(40):
        batch, slots, width = rng.randint(1, 6), rng.randint(1, 15), rng.randint(1, 8)
        budget = rng.choice([0, 1, 2, 7, 16, 33, 64, 127])
        cap = rng.choice([None, None, 1, 2, 5])
        ids, scores = random_lattice(gen, batch, slots, width, ties=rng.random() < 0.5)
        if rng.random() < 0.3:  # masked candidates: -inf scores (each row keeps a finite one)
            scores[..., 1:] = torch.where(
                torch.rand(scores[..., 1:].shape, generator=gen) < 0.3, -math.inf, scores[..., 1:]
            )
        temp = random_temperatures(gen, batch)
        got = build_lattice_tree_batched(ids, scores, budget, temperature=temp, top_k_cap=cap)
        want, _ = build_lattice_tree_reference(ids, scores, budget, temperature=temp, top_k_cap=cap)
        assert got.equals(want), describe_mismatch(got, want)


def test_lattice_tree_invariants_and_links():
    gen = torch.Generator().manual_seed(2)
    ids, scores = random_lattice(gen, 6, 7, 6, ties=True)
    tree = build_lattice_tree_batched(ids, scores, 50, root_tokens=torch.full((6,), 7))
    assert tree.tokens.dtype == torch.int64 and tree.parents.dtype == torch.int32
    assert tree.depths.dtype == torch.int32 and tree.ranks.dtype == torch.int32
    assert tree.scores.dtype == torch.float32 and tree.num_nodes.dtype == torch.int32
    assert tree.tokens.shape == (6, 51) and tree.num_nodes.tolist() == [50] * 6
    for b in range(tree.batch_size):
        req = tree.request(b)
        assert req["tokens"][0] == 7 and req["parents"][0] == -1 and req["ranks"][0] == 0
        for i in range(1, 51):
            p = req["parents"][i]
            assert 0 <= p < i and req["depths"][i] == req["depths"][p] + 1
            assert req["scores"][i] <= req["scores"][i - 1]
    links = eagle_verify_links(tree)  # the verify links take the lattice tree unchanged
    assert links.retrive_next_token.shape == (6, 51)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
def test_batched_on_cuda_equals_reference(ties):
    gen = torch.Generator().manual_seed(21)
    for batch, slots, width, budget, cap in SHAPES + [(64, 7, 16, 127, None), (32, 15, 16, 256, 8)]:
        ids, scores = random_lattice(gen, batch, slots, width, ties)
        temp = torch.rand(batch, generator=gen) + 0.2
        got = build_lattice_tree_batched(ids.cuda(), scores.cuda(), budget, temp.cuda(), cap).to("cpu")
        want, _ = build_lattice_tree_reference(ids.cuda(), scores.cuda(), budget, temp.cuda(), cap)
        assert got.equals(want), describe_mismatch(got, want)


# --- a lattice that carries no more than marginals --------------------------------------------


@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
@pytest.mark.parametrize("temperature", [None, 0.7, "per-request"])
def test_parent_independent_rows_give_the_marginal_tree(ties, temperature):
    # Every row of a slot the same for all parents: the lattice says nothing the per-slot
    # marginals don't, and the tree must be build_tree_batched's on draft_topk of that row,
    # bit for bit (tokens, parents, depths, ranks, scores).
    gen = torch.Generator().manual_seed(zlib.crc32(repr((ties, temperature)).encode()))
    for batch, slots, width, budget, cap in [(4, 7, 8, 127, None), (3, 15, 6, 100, None), (5, 5, 4, 64, 3)]:
        ids, rows = random_lattice(gen, batch, slots, width, ties)
        unary = rows[:, :, 0, :]  # [B, E, K]
        scores = unary[:, :, None, :].expand(batch, slots, width, width).contiguous()
        if temperature == "per-request":
            temps = torch.tensor([0.5, 1.0, 1.6, 0.9, 1.2])[:batch]
            per = [draft_topk(unary[b : b + 1], width, temperature=float(temps[b])) for b in range(batch)]
            lp, idx = torch.cat([x[0] for x in per]), torch.cat([x[1] for x in per])
        else:
            temps = temperature
            lp, idx = draft_topk(unary, width, temperature=temperature)
        roots = torch.randint(0, 50_000, (batch,), generator=gen)
        marginal = build_tree_batched(lp, ids.gather(-1, idx), budget, top_k_cap=cap, root_tokens=roots)
        lattice = build_lattice_tree_batched(ids, scores, budget, temperature=temps, top_k_cap=cap, root_tokens=roots)
        assert lattice.equals(marginal), describe_mismatch(lattice, marginal)


# --- the draft distribution q ------------------------------------------------------------------


def test_draft_q_rows_are_the_rows_children_were_drawn_from():
    gen = torch.Generator().manual_seed(8)
    batch, slots, width, budget = 5, 6, 5, 40
    ids, scores = random_lattice(gen, batch, slots, width, ties=False)
    temps = torch.tensor([0.5, 1.0, 0.0, 1.5, 0.8])
    tree = build_lattice_tree_batched(ids, scores, budget, temperature=temps)
    _, heaps = build_lattice_tree_reference(ids, scores, budget, temperature=temps)
    q = lattice_draft_q(tree, ids, scores, temperature=temps)
    _, order = lattice_log_probs(scores, temps)
    assert torch.equal(q.slot_candidates, lattice_slot_candidates(tree, order))
    t = lattice_temperatures(temps, batch)
    for b in range(batch):
        req = tree.request(b)
        count = int(tree.num_nodes[b])
        assert q.slot_candidates[b, 1 : count + 1].tolist() == heaps[b].candidates
        assert q.slot_candidates[b, 0] == -1 and q.slot_candidates[b, count + 1 :].eq(-1).all()
        for i in range(count + 1):
            d = req["depths"][i]
            own = 0 if i == 0 else heaps[b].candidates[i - 1]
            if d < slots:
                want = torch.softmax(scores[b, d, own] / t[b], -1)
                assert torch.allclose(q.probs[b, i], want, atol=1e-6)
                assert q.candidate_ids[b, i].tolist() == ids[b, d].tolist()
            else:
                assert q.probs[b, i].eq(0).all() and q.candidate_ids[b, i].eq(-1).all()
            if i > 0:  # a node's step in score is its log-prob under its parent's q
                p = req["parents"][i]
                step = req["scores"][i] - req["scores"][p]
                assert abs(step - math.log(float(q.probs[b, p, heaps[b].candidates[i - 1]]))) < 1e-4
        assert q.probs[b, count + 1 :].eq(0).all()


# --- offline acceptance on a synthetic Markov source ----------------------------------------------

VOCAB_M = 48
SLOTS_M = 7  # a DFlash2 block of 8: the anchor and 7 drafted slots
BUDGETS_M = (1, 4, 8, 16, 32, 64, 127)


def markov_case(seed: int, sharpness: float, width: int, batch: int):
    """A true bigram chain P and, per request (an anchor token), the two drafts of one block.

    Candidates of slot e: the top-``width`` tokens of the chain's true marginal at slot e given
    the anchor (the best an independent per-slot drafter can offer). The marginal draft gives
    their true marginal log-probs; the lattice gives the true transition log-probs
    ``log P[prev, c]`` between adjacent candidates (the anchor before slot 0).
    """
    gen = torch.Generator().manual_seed(seed)
    trans = torch.softmax(torch.randn(VOCAB_M, VOCAB_M, generator=gen, dtype=torch.float64) * sharpness, -1)
    anchors = torch.randint(0, VOCAB_M, (batch,), generator=gen)
    dist = torch.nn.functional.one_hot(anchors, VOCAB_M).to(torch.float64)
    marginals = []
    for _ in range(SLOTS_M):
        dist = dist @ trans
        marginals.append(dist)
    top = torch.stack(marginals, 1).topk(width, dim=-1)  # [B, E, K], sorted descending
    cand_ids, marg_lp = top.indices, top.values.log().to(torch.float32)
    prev = torch.cat([anchors[:, None, None].expand(batch, 1, width), cand_ids[:, :-1]], 1)  # [B, E, K]
    scores = trans.log()[prev[:, :, :, None], cand_ids[:, :, None, :]].to(torch.float32)  # [B, E, K, K]
    return trans, anchors, cand_ids, marg_lp, scores


def path_probs(tree: DDTreeBatch, trans: torch.Tensor) -> torch.Tensor:
    """``[B, n]`` P(the target's first ``depth`` tokens spell the slot's path), target = the chain at T = 1."""
    batch, n = tree.batch_size, tree.num_slots
    prob = torch.zeros(batch, n, dtype=torch.float64)
    prob[:, 0] = 1.0
    parents = tree.parents.to(torch.int64).clamp(min=0)
    is_node = tree.slot_is_node()
    for t in range(1, n):
        p = parents[:, t : t + 1]
        step = trans[tree.tokens.gather(1, p)[:, 0], tree.tokens[:, t]]
        prob[:, t] = torch.where(is_node[:, t], prob.gather(1, p)[:, 0] * step, 0.0)
    return prob


def expected_accept(tree: DDTreeBatch, trans: torch.Tensor) -> float:
    """Mean over requests of E[accepted drafted tokens] under the sampled walk at T = 1, exactly.

    The walk accepts depth >= d iff the target's first d sampled tokens form a node's path, and the
    paths at one depth are distinct (one slot's candidates are distinct), so E[accept] = the sum
    of all nodes' path probabilities.
    """
    return float(path_probs(tree, trans)[:, 1:].sum(1).mean())


def greedy_accept(tree: DDTreeBatch, trans: torch.Tensor) -> float:
    """Mean accepted length when the target is the chain's argmax (T = 0)."""
    batch = tree.batch_size
    parents, is_node = tree.parents.to(torch.int64), tree.slot_is_node()
    is_node[:, 0] = False
    cur = torch.zeros(batch, dtype=torch.int64)
    alive = torch.ones(batch, dtype=torch.bool)
    accepted = torch.zeros(batch)
    for _ in range(SLOTS_M):
        want = trans[tree.tokens.gather(1, cur[:, None])[:, 0]].argmax(-1)
        match = is_node & (parents == cur[:, None]) & (tree.tokens == want[:, None])
        alive &= match.any(1)
        cur = torch.where(alive, match.to(torch.int32).argmax(1).to(torch.int64), cur)
        accepted += alive
    return float(accepted.mean())


# (sharpness of the chain's rows, K): asserted cases. K = 16 is the published DFlash2 selector_top_k.
MARKOV_CASES = [(3.0, 8), (2.0, 16), (3.0, 16)]


@pytest.mark.parametrize("sharpness,width", MARKOV_CASES + [(1.5, 8)])
def test_markov_source_lattice_tree_accepts_at_least_the_marginal_tree(sharpness, width):
    seeds, batch = (0, 1), 128
    rows = []
    for budget in BUDGETS_M:
        acc = {"lattice": [0.0, 0.0], "marginal": [0.0, 0.0]}
        for seed in seeds:
            trans, anchors, cand_ids, marg_lp, scores = markov_case(seed, sharpness, width, batch)
            trees = {
                "lattice": build_lattice_tree_batched(cand_ids, scores, budget, root_tokens=anchors),
                "marginal": build_tree_batched(marg_lp, cand_ids, budget, root_tokens=anchors),
            }
            for name, tree in trees.items():
                acc[name][0] += expected_accept(tree, trans) / len(seeds)
                acc[name][1] += greedy_accept(tree, trans) / len(seeds)
        rows.append((budget, acc["lattice"], acc["marginal"]))
    asserted = (sharpness, width) in MARKOV_CASES
    print(
        f"\nMarkov source V={VOCAB_M} E={SLOTS_M} K={width} sharpness={sharpness} "
        f"({len(seeds)} chains x {batch} anchors){'' if asserted else '  [not asserted]'}"
    )
    print("budget  E[accept] T=1 lattice / marginal   accept T=0 lattice / marginal")
    for budget, lat, mar in rows:
        print(f"{budget:6d}  {lat[0]:8.3f} / {mar[0]:8.3f}            {lat[1]:8.3f} / {mar[1]:8.3f}")
    if not asserted:
        return  # a diffuse chain with K = 8: see docs/core.md (renormalization over K candidates)
    for budget, lat, mar in rows:
        assert lat[0] >= mar[0] - 1e-12, (budget, lat, mar)
        assert lat[1] >= mar[1], (budget, lat, mar)
    assert rows[-1][1][0] > rows[-1][2][0] * 1.1, "at a full budget the lattice tree is clearly ahead"


def test_markov_exact_expectation_matches_the_sampled_walk():
    # expected_accept (above) is what core.walk.sampled_walk gives on average, with the chain as target.
    trans, anchors, cand_ids, _, scores = markov_case(3, 3.0, 8, 128)
    tree = build_lattice_tree_batched(cand_ids, scores, 32, root_tokens=anchors)
    exact = expected_accept(tree, trans)
    logits = trans.log().to(torch.float32)[tree.tokens]  # [B, n, V]: the target after each slot's token
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([sampled_walk(tree, logits, 1.0, gen).accept_len for _ in range(40)]).to(torch.float64)
    mean, stderr = float(draws.mean()), float(draws.std() / math.sqrt(draws.numel()))
    print(f"\nexact E[accept] {exact:.4f}, sampled walk {mean:.4f} +- {stderr:.4f}")
    assert abs(mean - exact) < 4 * stderr + 1e-9
