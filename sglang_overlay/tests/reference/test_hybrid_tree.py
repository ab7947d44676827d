"""DDTree over a hybrid target (issue 56): every tree node's recurrent state comes from its parent's.

The reference target (``reference.hybrid.HybridLM``) mixes causal attention with Gated-DeltaNet and
Mamba2-like recurrent layers (each with a causal conv window). Checked here, in float64 on CPU:

* ``tree_verify``'s logits at every node equal sequential decoding along the root-to-node path, bit
  for bit, and ``commit`` of a path equals stepping its tokens (trees from the core builder, with
  accepted-able nodes behind earlier siblings in the window);
* greedy DDTree equals greedy decoding token for token, for a batch mixing prompt lengths, with
  requests that finish in the middle of a step (length limit and EOS);
* the sampled walk keeps the target's distribution: one step's output distribution by exact
  enumeration, and the decoder's first tokens by a chi-square test;
* a planted control, ``PredecessorStateLM`` (each slot continues from the recurrent state its
  predecessor in the verify window left, i.e. the window verified as a chain, which is what a
  recurrent verify without parent pointers does), fails the same checks.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from ddtree_stats import ALPHA, chi_square_fit

from sglang_overlay.core.tree import build_tree_batched, draft_topk
from sglang_overlay.reference.hybrid import (
    HybridLM,
    HybridNoisyDrafter,
    generate_hybrid_ar,
    generate_hybrid_ddtree,
    tree_paths,
)

LAYOUTS = {
    "gdn": ("gdn", "attn", "gdn", "attn"),
    "mamba2": ("mamba2", "attn", "mamba2"),
    "mixed": ("gdn", "mamba2", "attn", "gdn"),
}
SEED = 2


class PredecessorStateLM(HybridLM):
    """Planted control: slot ``i`` continues from slot ``i - 1``'s recurrent state (its predecessor in
    the window), not its parent's. Attention still uses the tree mask. Only the tree verify differs:
    ``step``/``prefill`` (plain decoding) are the real ones."""

    @staticmethod
    def input_slot(parents, slot):
        return slot - 1


def make(layout: str, control: bool = False, **kw) -> HybridLM:
    cls = PredecessorStateLM if control else HybridLM
    return cls(layers=LAYOUTS[layout], seed=kw.pop("seed", SEED), **kw)


def built_tree(model: HybridLM, context: list[int], budget: int, draft_len: int, top_k: int, noise: float = 0.7):
    """One request's tree from the real builder over noisy drafts of the target's continuation."""
    drafter = HybridNoisyDrafter(model, noise_std=noise, seed=5)
    drafts = drafter.draft(torch.tensor(context), draft_len)
    log_probs, token_ids = draft_topk(drafts[None], top_k)
    state, logits = model.prefill(context)
    root = int(logits.argmax())
    tree = build_tree_batched(log_probs, token_ids, budget, root_tokens=torch.tensor([root]))
    m = int(tree.num_nodes[0]) + 1
    return state, tree.tokens[0, :m].tolist(), tree.parents[0, :m].tolist(), tree.ranks[0, :m].tolist()


def sibling_behind(parents: list[int]) -> list[int]:
    """Slots whose predecessor in the window is not their parent (a sibling or its subtree precedes them)."""
    return [i for i in range(1, len(parents)) if parents[i] != i - 1]


def node_mismatches(model: HybridLM, state, tokens: list[int], parents: list[int]) -> list[int]:
    """Slots whose tree-verify logits or recurrent snapshots differ from sequential decoding of their path."""
    out = model.tree_verify(state, tokens, parents)
    bad = []
    for i, path in enumerate(tree_paths(parents)):
        s, logits = state, None
        for slot in path:
            s, logits = model.step(s, tokens[slot])
        same = torch.equal(logits, out.logits[i])
        for li, kind in enumerate(model.kinds):
            if kind != "attn":
                same &= all(torch.equal(a, b) for a, b in zip(s.layers[li], out.layer_out[i][li]))
        if not same:
            bad.append(i)
    return bad


# --- tree verify and commit, node by node ---------------------------------------------------------


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_tree_verify_equals_sequential_decoding_along_every_path(layout):
    model = make(layout)
    state, tokens, parents, ranks = built_tree(model, [3, 1, 4, 1, 5], budget=24, draft_len=4, top_k=4)
    assert len(tokens) == 25 and max(ranks) >= 2 and len(sibling_behind(parents)) >= 8
    assert node_mismatches(model, state, tokens, parents) == []


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_commit_keeps_the_accepted_paths_state(layout):
    model = make(layout)
    state, tokens, parents, _ = built_tree(model, [2, 7, 1], budget=16, draft_len=4, top_k=4)
    out = model.tree_verify(state, tokens, parents)
    paths = tree_paths(parents)
    checked = 0
    for i in sibling_behind(parents):  # paths through non-first siblings
        committed = model.commit(state, out, paths[i])
        s = state
        for slot in paths[i]:
            s, _ = model.step(s, tokens[slot])
        assert committed.length == s.length
        for a, b in zip(committed.layers, s.layers):
            assert all(torch.equal(x, y) for x, y in zip(a, b))
        checked += 1
    assert checked >= 5
    deeper = next(i for i in range(1, len(parents)) if parents[i] != 0)
    with pytest.raises(ValueError, match="not a child"):
        model.commit(state, out, [0, deeper])


def test_tree_paths_and_bad_trees():
    assert tree_paths([-1, 0, 0, 1, 2, 3]) == [[0], [0, 1], [0, 2], [0, 1, 3], [0, 2, 4], [0, 1, 3, 5]]
    with pytest.raises(ValueError):
        tree_paths([-1, 0, 3, 1])
    with pytest.raises(ValueError):
        tree_paths([0, 0])


# --- greedy decoding ------------------------------------------------------------------------------

PROMPTS = [[5], [3, 1, 4], [2, 7, 1, 8, 2, 8, 1], [9, 9, 8, 2, 4, 3, 5, 3, 6, 1, 11, 13]]
LIMITS = [22, 9, 15, 22]


@pytest.fixture(scope="module")
def greedy_reference():
    return {
        layout: [generate_hybrid_ar(make(layout), p, n) for p, n in zip(PROMPTS, LIMITS)]
        for layout in ("gdn", "mamba2")
    }


@functools.lru_cache(maxsize=None)
def greedy_batch(layout: str, budget: int, control: bool = False, eos: int | None = None):
    model = make(layout, control=control)
    drafter = HybridNoisyDrafter(model, noise_std=0.7, seed=budget)
    return generate_hybrid_ddtree(
        model, drafter, PROMPTS, LIMITS, budget=budget, draft_len=4, top_k=4, eos_token_id=eos
    )


@pytest.mark.parametrize("budget", [1, 4, 16])
@pytest.mark.parametrize("layout", ["gdn", "mamba2"])
def test_greedy_ddtree_equals_greedy_decoding(greedy_reference, layout, budget):
    results = greedy_batch(layout, budget)
    assert [r.tokens for r in results] == greedy_reference[layout]
    assert sum(sum(r.accept_lens) for r in results) > 0
    assert any(r.emitted > len(r.tokens) for r in results)  # a request finished in the middle of a step
    if budget >= 4:
        assert sum(r.sibling_accepts for r in results) > 0  # accepted paths through non-first siblings


def test_greedy_ddtree_with_eos_mid_step(greedy_reference):
    model = make("gdn")
    eos = greedy_reference["gdn"][0][6]
    ar = [generate_hybrid_ar(model, p, n, eos_token_id=eos) for p, n in zip(PROMPTS, LIMITS)]
    assert any(len(a) < n for a, n in zip(ar, LIMITS))
    assert [r.tokens for r in greedy_batch("gdn", 16, eos=eos)] == ar


def test_bigger_trees_accept_more():
    # Not a correctness property: the sign that the tree's side branches are used.
    mean = {}
    for budget in (1, 16):
        results = greedy_batch("gdn", budget)
        mean[budget] = sum(sum(r.accept_lens) for r in results) / sum(len(r.accept_lens) for r in results)
    assert mean[16] > mean[1] + 0.8, mean


# --- sampling: exact distributions ----------------------------------------------------------------


def step_distribution(model: HybridLM, state, tokens, parents, temperature: float) -> dict[tuple, float]:
    """Exact distribution of one sampled-walk step's emitted tokens (accepted path + bonus).

    At the current slot the target's token t has probability softmax(logits / T)[t]; a child carrying
    t (the smallest slot, as ``walk_tree``) is accepted and the walk goes on, otherwise t is the bonus.
    """
    probs = torch.softmax(model.tree_verify(state, tokens, parents).logits / temperature, dim=-1)
    children: dict[int, dict[int, int]] = {}
    for i in range(1, len(tokens)):
        children.setdefault(parents[i], {}).setdefault(tokens[i], i)
    out: dict[tuple, float] = {}

    def walk(slot: int, prefix: tuple, p: float) -> None:
        for t in range(model.vocab_size):
            q = p * float(probs[slot, t])
            child = children.get(slot, {}).get(t)
            if child is None:
                out[prefix + (t,)] = q
            else:
                walk(child, prefix + (t,), q)

    walk(0, (), 1.0)
    return out


def target_probability(model: HybridLM, state, root: int, seq: tuple, temperature: float) -> float:
    s, logits = model.step(state, root)
    p = 1.0
    for t in seq:
        p *= float(torch.softmax(logits / temperature, dim=-1)[t])
        s, logits = model.step(s, t)
    return p


def step_distribution_error(model: HybridLM, temperature: float) -> float:
    state, tokens, parents, _ = built_tree(model, [4, 2], budget=12, draft_len=3, top_k=3, noise=1.0)
    dist = step_distribution(model, state, tokens, parents, temperature)
    assert abs(sum(dist.values()) - 1.0) < 1e-12
    assert max(len(seq) for seq in dist) >= 3  # the enumeration reaches depth 2 of the tree
    return max(abs(p - target_probability(model, state, tokens[0], seq, temperature)) for seq, p in dist.items())


SMALL = dict(vocab_size=6, logit_scale=2.0)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("layout", ["gdn", "mamba2"])
def test_one_step_output_distribution_is_the_targets_exactly(layout, temperature):
    assert step_distribution_error(make(layout, **SMALL), temperature) < 1e-12


SAMPLED_PROMPT = [1, 4, 2]
SAMPLED_TOKENS = 3
RUNS = 150


def exact_first_tokens(model: HybridLM, temperature: float) -> np.ndarray:
    v = model.vocab_size
    state, logits = model.prefill(SAMPLED_PROMPT)
    out = np.zeros((v,) * SAMPLED_TOKENS)
    p1 = torch.softmax(logits / temperature, -1)
    for a in range(v):
        s2, l2 = model.step(state, a)
        p2 = torch.softmax(l2 / temperature, -1)
        for b in range(v):
            _, l3 = model.step(s2, b)
            out[a, b] = float(p1[a] * p2[b]) * torch.softmax(l3 / temperature, -1).double().numpy()
    return out


def sampled_fit(model: HybridLM, temperature: float = 1.0):
    drafter = HybridNoisyDrafter(model, noise_std=0.5, seed=0)
    counts = np.zeros((model.vocab_size,) * SAMPLED_TOKENS)
    accepted = 0
    for seed in range(RUNS):
        gen = torch.Generator().manual_seed(seed)
        (result,) = generate_hybrid_ddtree(
            model,
            drafter,
            [SAMPLED_PROMPT],
            SAMPLED_TOKENS,
            budget=6,
            draft_len=2,
            temperature=temperature,
            generator=gen,
        )
        counts[tuple(result.tokens)] += 1
        accepted += sum(result.accept_lens)
    return chi_square_fit(counts, exact_first_tokens(model, temperature)), accepted


def test_sampled_ddtree_keeps_the_target_distribution():
    fit, accepted = sampled_fit(make("mixed", **SMALL))
    assert fit.p_value > ALPHA, str(fit)
    assert accepted > RUNS // 4  # the tree did part of the work


# --- the planted control fails the same checks ----------------------------------------------------


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_control_predecessor_state_fails_the_node_check(layout):
    model = make(layout, control=True)
    state, tokens, parents, _ = built_tree(model, [3, 1, 4, 1, 5], budget=24, draft_len=4, top_k=4)
    bad = node_mismatches(model, state, tokens, parents)
    # exactly the slots behind a sibling go wrong, and their subtrees
    assert bad and set(sibling_behind(parents)) <= set(bad)
    assert all(any(a in sibling_behind(parents) for a in path) for path in (tree_paths(parents)[i] for i in bad))


@pytest.mark.parametrize("layout", ["gdn", "mamba2"])
def test_control_predecessor_state_fails_greedy_equality(greedy_reference, layout):
    results = greedy_batch(layout, 16, control=True)
    assert [r.tokens for r in results] != greedy_reference[layout]


@pytest.mark.parametrize("layout", ["gdn", "mamba2"])
def test_control_predecessor_state_fails_the_exact_distribution(layout):
    assert step_distribution_error(make(layout, control=True, **SMALL), 1.0) > 1e-6


def test_control_predecessor_state_fails_the_chi_square():
    fit, _ = sampled_fit(make("mixed", control=True, **SMALL))
    assert fit.p_value < ALPHA, f"the predecessor-state control was not detected: {fit}"


def test_control_is_only_the_planted_rule():
    # Same weights, same plain decoding: the control differs in the tree verify alone.
    good, bad = make("gdn"), make("gdn", control=True)
    assert generate_hybrid_ar(good, PROMPTS[2], 10) == generate_hybrid_ar(bad, PROMPTS[2], 10)
    chain_parents = list(range(-1, 6))  # a chain: predecessor == parent, so the control is right there
    state, _ = good.prefill(PROMPTS[1])
    tokens = [3, 1, 4, 1, 5, 9, 2]
    assert node_mismatches(bad, state, tokens, chain_parents) == []
    assert sibling_behind([-1, 0, 0, 1]) == [2, 3]
