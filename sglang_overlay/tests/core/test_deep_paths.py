"""Lossless at every depth: the core walks against a brute-force reference on trees as deep as the
block allows (15 drafted positions), greedy and sampled, through first, middle and last siblings.

``deep_trees`` holds the reference (plain lists, nothing shared with ``core.walk``) and the planted
trees. A walk that takes the first child past depth 8 whatever the target's token fails the planted
tests here (``broken_deep_walk`` is that walk, kept as a control)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from ddtree_stats import ALPHA, chi_square_fit
from deep_trees import (
    CONFIGS,
    DEPTH,
    RANKS,
    TREE_KINDS,
    TreeLists,
    build,
    deep_coverage,
    every_node_case,
    greedy_logits,
    lattice_every_node_case,
    planted_case,
    planted_draft,
    reference_walk,
    replicate,
    sampling_logits,
    targets_for_paths,
    tree_lists,
    walk_mismatches,
)

from sglang_overlay.core.tree import DDTreeBatch, build_tree_batched
from sglang_overlay.core.walk import WalkResult, greedy_walk, sample_target_tokens, sampled_walk, walk_tree

SAMPLED_COPIES = 16  # sampled: each planned path is walked this many times with independent draws


# ---- the reference itself -------------------------------------------------------------------------


def test_the_reference_walk_on_a_hand_built_tree():
    #        0 (root)
    #      /   \
    #     1(5)  2(7)
    #    / \      \
    #  3(7) 4(9)  5(5)
    #        |
    #       6(5)
    tree = TreeLists(tokens=[1, 5, 7, 7, 9, 5, 5], parents=[-1, 0, 0, 1, 1, 2, 4])
    assert reference_walk(tree, [5, 9, 0, 0, 5, 0, 8]) == reference_walk(tree, [5, 9, 3, 3, 5, 3, 8])
    ref = reference_walk(tree, [5, 9, 0, 0, 5, 0, 8])
    assert ref.path == [0, 1, 4, 6] and ref.bonus == 8
    ref = reference_walk(tree, [7, 9, 5, 0, 0, 3, 0])
    assert ref.path == [0, 2, 5] and ref.bonus == 3
    assert reference_walk(tree, [4, 0, 0, 0, 0, 0, 0]).path == [0]
    assert tree.sibling_index(4) == (1, 2) and tree.depth(6) == 3 and tree.ancestors(6) == [0, 1, 4, 6]


# ---- chains of the full block depth -----------------------------------------------------------------


def full_depth_chain(copies: int) -> DDTreeBatch:
    gen = torch.Generator().manual_seed(1)
    lp, ids = planted_draft((), 1, gen)
    return replicate(build([(lp, ids)], DEPTH, 1), [0] * copies)


def test_a_chain_of_full_block_depth_greedy():
    tree = full_depth_chain(DEPTH + 1)
    lists = tree_lists(tree, 0)
    assert [lists.depth(s) for s in range(lists.num_slots)] == list(range(DEPTH + 1))
    # Request a accepts exactly a nodes (0..15), then the target leaves the chain.
    paths = [list(range(a + 1)) for a in range(DEPTH + 1)]
    target = targets_for_paths(tree, paths, torch.Generator().manual_seed(2))
    walk = greedy_walk(tree, greedy_logits(target, torch.Generator().manual_seed(3)))
    assert walk_mismatches(tree, target, walk) == []
    assert walk.accept_len.tolist() == list(range(DEPTH + 1))


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_a_chain_of_full_block_depth_sampled(temperature):
    tree = full_depth_chain((DEPTH + 1) * SAMPLED_COPIES)
    paths = [list(range(a % (DEPTH + 1) + 1)) for a in range(tree.batch_size)]
    target = targets_for_paths(tree, paths, torch.Generator().manual_seed(4))
    logits = sampling_logits(target, torch.Generator().manual_seed(5), boost=6.0)
    draws = sample_target_tokens(logits, temperature, torch.Generator().manual_seed(6))
    walk = sampled_walk(tree, logits, temperature, torch.Generator().manual_seed(6))
    assert walk_mismatches(tree, draws, walk) == []
    assert int(walk.accept_len.max()) == DEPTH


# ---- planted paths through first, middle and last siblings ------------------------------------------


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("depth", range(1, DEPTH + 1))
@pytest.mark.parametrize("k,budget", CONFIGS)
def test_greedy_walk_through_a_planted_sibling(k, budget, depth, rank):
    tree, paths = planted_case(k, budget, depth, rank)
    target = targets_for_paths(tree, paths, torch.Generator().manual_seed(depth))
    walk = greedy_walk(tree, greedy_logits(target, torch.Generator().manual_seed(depth + 1)))
    assert walk_mismatches(tree, target, walk) == []
    assert walk.accept_len.tolist() == [len(p) - 1 for p in paths]


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("depth", range(1, DEPTH + 1))
@pytest.mark.parametrize("k,budget", CONFIGS)
def test_sampled_walk_through_a_planted_sibling(k, budget, depth, rank):
    tree, paths = planted_case(k, budget, depth, rank, copies=SAMPLED_COPIES)
    target = targets_for_paths(tree, paths, torch.Generator().manual_seed(depth))
    logits = sampling_logits(target, torch.Generator().manual_seed(depth + 1), boost=12.0)
    # The same draws for the walk under test and for the reference.
    draws = sample_target_tokens(logits, 1.0, torch.Generator().manual_seed(depth + 2))
    walk = sampled_walk(tree, logits, 1.0, torch.Generator().manual_seed(depth + 2))
    assert walk_mismatches(tree, draws, walk) == []
    # The draws followed the plan almost everywhere: the planted deep paths were walked.
    planned = torch.tensor([len(p) - 1 for p in paths])
    assert float((walk.accept_len == planned).float().mean()) > 0.9


# ---- every node of a deep tree as the end of the accepted path ----------------------------------------


@pytest.mark.parametrize("kind", TREE_KINDS)
def test_greedy_walk_to_every_node(kind):
    tree, paths = every_node_case(kind)
    coverage = deep_coverage(tree_lists(tree, 0), paths)
    assert coverage["deepest"] == TREE_KINDS[kind][3], coverage
    assert coverage["past8_with_children"] > 0 and coverage["past8_non_first"] > 0, coverage
    if kind != "wide_then_deep":
        assert coverage["non_first_past8"] > 0, coverage
    target = targets_for_paths(tree, paths, torch.Generator().manual_seed(11))
    walk = greedy_walk(tree, greedy_logits(target, torch.Generator().manual_seed(12)))
    assert walk_mismatches(tree, target, walk) == []


def test_greedy_and_sampled_walks_to_every_node_of_a_dflash2_lattice_tree():
    tree, paths = lattice_every_node_case()
    coverage = deep_coverage(tree_lists(tree, 0), paths)
    assert coverage["deepest"] == DEPTH and coverage["non_first_past8"] > 0, coverage
    target = targets_for_paths(tree, paths, torch.Generator().manual_seed(21))
    walk = greedy_walk(tree, greedy_logits(target, torch.Generator().manual_seed(22)))
    assert walk_mismatches(tree, target, walk) == []
    logits = sampling_logits(target, torch.Generator().manual_seed(23))
    draws = sample_target_tokens(logits, 0.8, torch.Generator().manual_seed(24))
    walk = sampled_walk(tree, logits, 0.8, torch.Generator().manual_seed(24))
    assert walk_mismatches(tree, draws, walk) == []


@pytest.mark.parametrize("kind", TREE_KINDS)
def test_sampled_walk_to_every_node(kind):
    tree, paths = every_node_case(kind)
    picks = [b for b in range(tree.batch_size) for _ in range(4)]
    tree, paths = replicate(tree, picks), [paths[b] for b in picks]
    target = targets_for_paths(tree, paths, torch.Generator().manual_seed(13))
    logits = sampling_logits(target, torch.Generator().manual_seed(14))
    draws = sample_target_tokens(logits, 0.8, torch.Generator().manual_seed(15))
    walk = sampled_walk(tree, logits, 0.8, torch.Generator().manual_seed(15))
    assert walk_mismatches(tree, draws, walk) == []
    assert int(walk.accept_len.max()) >= 14 and bool((walk.accept_len < walk.accept_len.max()).any())


# ---- the sampled walk's distribution on a deep tree --------------------------------------------------

MARKOV_VOCAB = 4
MARKOV_DEPTH = 12
MARKOV_K = 2
MARKOV_BUDGET = 64
MARKOV_ROOT = 0
MARKOV_SAMPLES = 40_000


def markov_table() -> torch.Tensor:
    """The target's log-probs of the next token given the last one: next = last + 1 (mod V) with 0.8."""
    p = torch.full((MARKOV_VOCAB, MARKOV_VOCAB), 0.2 / (MARKOV_VOCAB - 1), dtype=torch.float64)
    p[torch.arange(MARKOV_VOCAB), (torch.arange(MARKOV_VOCAB) + 1) % MARKOV_VOCAB] = 0.8
    return p.log()


@functools.cache
def markov_tree() -> DDTreeBatch:
    """A deep tree of a good drafter: at position i the target's greedy token and the next one."""
    i = torch.arange(MARKOV_DEPTH)
    ids = torch.stack([(MARKOV_ROOT + i + 1) % MARKOV_VOCAB, (MARKOV_ROOT + i + 2) % MARKOV_VOCAB], dim=1)
    lp = torch.tensor([-0.2, -1.7]).expand(MARKOV_DEPTH, MARKOV_K)
    return build_tree_batched(lp[None], ids[None], MARKOV_BUDGET, root_tokens=torch.tensor([MARKOV_ROOT]))


def exact_step_distribution(tree: TreeLists, table: torch.Tensor, temperature: float):
    """Every possible step output (accepted tokens then the bonus) and its exact probability.

    The step ends at node ``u`` with bonus ``y`` (no child of ``u`` carries ``y``) with probability
    ``P(path to u) * p(y | u)``, under the target's own conditionals at temperature ``temperature``.
    """
    cond = torch.softmax(table / temperature, dim=-1).tolist()
    outcomes, probs = {}, []
    reach = {0: 1.0}
    for u in range(tree.num_slots):  # slot order is topological
        p_u = cond[tree.tokens[u]]
        kids = {tree.tokens[c]: c for c in tree.children(u)}
        for y in range(MARKOV_VOCAB):
            if y in kids:
                reach[kids[y]] = reach[u] * p_u[y]
            else:
                seq = tuple(tree.tokens[s] for s in tree.ancestors(u)[1:]) + (y,)
                outcomes[seq] = len(probs)
                probs.append(reach[u] * p_u[y])
    return outcomes, np.array(probs), reach


def step_counts(outcomes: dict, walk) -> np.ndarray:
    """Observed step outputs per outcome; the last cell counts outputs the tree cannot produce."""
    counts = np.zeros(len(outcomes) + 1)
    for row, n in zip(walk.emitted_tokens.tolist(), walk.num_emitted.tolist()):
        counts[outcomes.get(tuple(row[:n]), len(outcomes))] += 1
    return counts


def broken_deep_walk(tree: DDTreeBatch, target: torch.Tensor, past: int = 8):
    """BROKEN control: the reference walk, except that past depth ``past`` it takes the first child
    whatever the target's token (and records the target's token as accepted)."""
    width = int(tree.depths.max()) + 1
    path = torch.full((tree.batch_size, width), -1, dtype=torch.int64)
    acc = torch.full((tree.batch_size, width - 1), -1, dtype=torch.int64)
    lens, bonus = torch.zeros(tree.batch_size, dtype=torch.int64), torch.zeros(tree.batch_size, dtype=torch.int64)
    lists_cache: dict = {}
    for b in range(tree.batch_size):
        key = (tuple(tree.parents[b].tolist()), tuple(tree.tokens[b].tolist()))
        if key not in lists_cache:
            lists = tree_lists(tree, b)
            lists_cache[key] = (lists, {s: lists.children(s) for s in range(lists.num_slots)})
        lists, kids = lists_cache[key]
        cur, step, row = 0, 0, target[b].tolist()
        path[b, 0] = 0
        while True:
            want = row[cur]
            hits = [c for c in kids[cur] if lists.tokens[c] == want or (step >= past and kids[cur])]
            if not hits:
                break
            acc[b, step] = want
            cur = min(hits)
            step += 1
            path[b, step] = cur
        lens[b], bonus[b] = step, row[cur]
    emitted = torch.cat([acc, torch.full((tree.batch_size, 1), -1, dtype=torch.int64)], dim=1)
    emitted[torch.arange(tree.batch_size), lens] = bonus
    return WalkResult(path, lens, acc, bonus, emitted)


def markov_run(temperature: float, seed: int, rule, samples: int = MARKOV_SAMPLES):
    base = markov_tree()
    lists = tree_lists(base, 0)
    tree = replicate(base, [0] * samples)
    table = markov_table()
    logits = table.float()[tree.tokens]  # the target's logits after each slot (a Markov target)
    walk = rule(tree, logits, temperature, torch.Generator().manual_seed(seed))
    outcomes, probs, reach = exact_step_distribution(lists, table, temperature)
    return lists, walk, outcomes, probs, reach


def correct_rule(tree, logits, temperature, gen):
    return sampled_walk(tree, logits, temperature, gen)


def first_child_past_8_rule(tree, logits, temperature, gen):
    return broken_deep_walk(tree, sample_target_tokens(logits, temperature, gen))


@pytest.mark.slow
@pytest.mark.parametrize("temperature,seed", [(1.0, 0), (0.7, 1)])
def test_the_sampled_walk_distribution_is_exact_on_a_deep_tree(temperature, seed):
    lists, walk, outcomes, probs, reach = markov_run(temperature, seed, correct_rule)
    # The tree is deep and the walks go deep: a tenth of the exact mass ends past depth 9.
    depths = [lists.depth(s) for s in range(lists.num_slots)]
    assert max(depths) == MARKOV_DEPTH
    deep_mass = sum(p for seq, p in zip(outcomes, probs) if len(seq) - 1 >= 10)
    assert deep_mass > 0.1, deep_mass
    assert float((walk.accept_len >= 10).float().mean()) > 0.1
    fit = chi_square_fit(step_counts(outcomes, walk), np.append(probs, 0.0))
    assert fit.p_value > ALPHA, str(fit)


@pytest.mark.slow
def test_a_walk_taking_the_first_child_past_depth_8_fails_the_distribution_test():
    # A fifth of the samples: the control walks in Python, and fails by far all the same.
    _, walk, outcomes, probs, _ = markov_run(1.0, 0, first_child_past_8_rule, MARKOV_SAMPLES // 5)
    fit = chi_square_fit(step_counts(outcomes, walk), np.append(probs, 0.0))
    assert fit.p_value < ALPHA, f"the broken deep walk was not detected: {fit}"


@pytest.mark.parametrize("k,budget", CONFIGS)
def test_a_walk_taking_the_first_child_past_depth_8_fails_the_planted_paths(k, budget):
    """The control walk agrees with the reference to depth 8 and fails past it, through every rank."""
    failing = set()
    for depth in range(1, DEPTH + 1):
        for rank in RANKS:
            tree, paths = planted_case(k, budget, depth, rank)
            target = targets_for_paths(tree, paths, torch.Generator().manual_seed(depth))
            if walk_mismatches(tree, target, broken_deep_walk(tree, target)):
                failing.add((depth, rank))
    # All but the path through the first sibling at depth 15: its end has no children, and the first
    # child is the right one all the way down.
    assert failing == {(d, r) for d in range(1, DEPTH + 1) for r in RANKS} - {(DEPTH, "first")}, sorted(failing)
    # and to check that the control itself is the reference up to depth 8: a walk never past it
    tree, paths = planted_case(k, budget, 1, "last")
    short = [p[:8] for p in paths]  # ends at depth 7 at most: the control never takes a step past 8
    target = targets_for_paths(tree, short, torch.Generator().manual_seed(0))
    assert walk_mismatches(tree, target, broken_deep_walk(tree, target)) == []
    assert walk_mismatches(tree, target, walk_tree(tree, target)) == []
