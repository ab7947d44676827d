"""The adapter's verify input on deep trees, and SGLang 0.5.23's own tree acceptance over its links,
against brute force: trees as deep as the block allows (15 drafted positions), budgets up to 255 with
top_k up to 8, paths through first, middle and last siblings, greedy and sampled.

* links, positions and the FULL mask of ``build_tree_verify_tensors`` equal those computed from the
  tree's parent slots alone;
* SGLang's ``verify_tree_greedy_triton`` (run under ``TRITON_INTERPRET=1``) on those links accepts the
  reference walk's path: with the target's argmax (greedy) and with one token drawn per slot from the
  target's distribution (sampled: the same draws for SGLang and the reference; SGLang's target-only
  sampling kernel is CUDA-only, its result is this walk over sampled tokens);
* the accepted step (``accepted_step``, and the one-launch kernel) on SGLang's outputs emits the
  reference's tokens and bonus.
"""

from __future__ import annotations

import os

import pytest
import torch
from deep_trees import (
    CONFIGS,
    DEPTH,
    RANKS,
    TREE_KINDS,
    VOCAB,
    every_node_case,
    greedy_logits,
    peaked_draft,
    planted_draft,
    planted_path,
    rank_of,
    reference_walk,
    sampling_logits,
    targets_for_paths,
    tree_lists,
)

from sglang_overlay.adapter.tree_verify import accepted_step, build_tree_verify_tensors
from sglang_overlay.core.walk import sample_target_tokens
from sglang_overlay.kernels import accept_path as ap


@pytest.fixture(scope="module")
def sgl():
    from core import _sglang_kernels  # the core tests' loader of SGLang's own kernels

    kernels = _sglang_kernels.load()
    if isinstance(kernels, str):
        pytest.skip(kernels)
    return kernels


def verify_tensors(drafts, budget: int, top_k: int, seed: int):
    """The adapter's verify input for one request per ``(lp, ids)``, window = budget + 1 (as the worker)."""
    lp = torch.stack([d[0] for d in drafts])
    ids = torch.stack([d[1] for d in drafts])
    bs = len(drafts)
    g = torch.Generator().manual_seed(seed)
    roots = torch.randint(0, VOCAB, (bs,), generator=g)
    prefix = torch.randint(0, 40, (bs,), generator=g)
    return build_tree_verify_tensors(lp, ids, roots, prefix, budget=budget, top_k=top_k, window=budget + 1), prefix


# ---- the verify input against brute force -------------------------------------------------------------


def layout_mismatches(t, prefix: torch.Tensor) -> list[str]:
    """Where the verify input differs from what the tree's parent slots alone say (padding: no links,
    depth 0, sees only itself)."""
    tree, w = t.tree, t.window
    out = []
    offset = 0
    for b in range(tree.batch_size):
        lists = tree_lists(tree, b)
        real = lists.num_slots
        first_child = [(lists.children(s) + [-1])[0] if s < real else -1 for s in range(w)]
        next_sibling = [-1] * w
        for s in range(1, real):
            later = [c for c in lists.children(lists.parents[s]) if c > s]
            next_sibling[s] = later[0] if later else -1
        depth = [lists.depth(s) if s < real else 0 for s in range(w)]
        if t.retrieve_index[b].tolist() != [b * w + s for s in range(w)]:
            out.append(f"request {b}: retrieve_index")
        if t.retrieve_next_token[b].tolist() != first_child:
            out.append(f"request {b}: retrieve_next_token {t.retrieve_next_token[b].tolist()} != {first_child}")
        if t.retrieve_next_sibling[b].tolist() != next_sibling:
            out.append(f"request {b}: retrieve_next_sibling {t.retrieve_next_sibling[b].tolist()} != {next_sibling}")
        if t.positions[b * w : (b + 1) * w].tolist() != [int(prefix[b]) + d for d in depth]:
            out.append(f"request {b}: positions")
        if t.draft_token[b * w : b * w + real].tolist() != lists.tokens:
            out.append(f"request {b}: draft tokens")
        row_len = int(prefix[b]) + w
        block = t.custom_mask[offset : offset + w * row_len].view(w, row_len)
        offset += w * row_len
        want = torch.zeros(w, w, dtype=torch.bool)
        for s in range(w):
            want[s, lists.ancestors(s) if s < real else [s]] = True
        if not (bool(block[:, : int(prefix[b])].all()) and torch.equal(block[:, int(prefix[b]) :].bool(), want)):
            out.append(f"request {b}: FULL mask")
    if t.custom_mask.numel() != offset:
        out.append(f"FULL mask of {t.custom_mask.numel()} entries, want {offset}")
    return out


LAYOUT_CASES = {
    "planted_k8_b255": (lambda g: [planted_draft((d,), 8, g) for d in (1, 8, 9, 12, 15)], 255, 8),
    "planted_k3_b63": (lambda g: [planted_draft((d,), 3, g) for d in (2, 9, 10, 14, 15)], 63, 3),
    "wide_then_deep": (lambda g: [planted_draft((1, 2), 8, g), planted_draft((9, 12, 15), 8, g)], 255, 8),
    "drafter_b255_k8": (lambda g: [peaked_draft(8, g) for _ in range(3)], 255, 8),
    "block_window": (lambda g: [planted_draft((9,), 4, g), planted_draft((12,), 4, g)], 15, 4),
}


@pytest.mark.parametrize("case", LAYOUT_CASES)
def test_links_positions_and_mask_equal_brute_force(case):
    make, budget, top_k = LAYOUT_CASES[case]
    t, prefix = verify_tensors(make(torch.Generator().manual_seed(5)), budget, top_k, seed=6)
    assert int(t.tree.depths.max()) >= 14
    # Siblings past depth 8: the links there matter.
    lists = [tree_lists(t.tree, b) for b in range(t.tree.batch_size)]
    assert any(tl.depth(s) > 8 and tl.sibling_index(s)[0] > 0 for tl in lists for s in range(1, tl.num_slots))
    assert layout_mismatches(t, prefix) == []


# ---- SGLang's tree acceptance over the links ----------------------------------------------------------


def sglang_accept(sgl, t, target: torch.Tensor):
    """``eagle_sample``'s greedy tree acceptance: ``verify_tree_greedy`` over the verify links, an
    ``accept_index`` as wide as the window (``NgramVerifyInput.max_tree_depth``)."""
    bs, w = t.tree.batch_size, t.window
    predict = torch.zeros(bs * w, dtype=torch.int32)
    accept_index = torch.full((bs, w), -1, dtype=torch.int32)
    num_correct = torch.empty(bs, dtype=torch.int32)
    sgl.verify_tree_greedy(
        predict,
        accept_index,
        num_correct,
        t.draft_token.view(bs, w),
        t.retrieve_index,
        t.retrieve_next_token,
        t.retrieve_next_sibling,
        target,
    )
    return predict, accept_index, num_correct


def acceptance_mismatches(t, target, prefix, predict, accept_index, num_correct, labels) -> list[str]:
    """SGLang's outputs, and the accepted step made of them, against the reference walk."""
    bs, w = t.tree.batch_size, t.window
    out = []
    step = accepted_step(predict, accept_index, num_correct + 1, prefix)
    steps = [("accepted_step", step.out_tokens, step.accept_lens, step.bonus)]
    if ap.accept_path_available() and os.environ.get("TRITON_INTERPRET") == "1":
        steps.append(("accept_path kernel", *ap.accept_path(predict, accept_index, num_correct + 1, prefix)[:3]))
    for b in range(bs):
        lists = tree_lists(t.tree, b)
        ref = reference_walk(lists, target[b].tolist())
        n = len(ref.path)
        rows = [b * w + s for s in ref.path]
        emitted = [lists.tokens[s] for s in ref.path[1:]] + [ref.bonus]
        got = (int(num_correct[b]), accept_index[b, :n].tolist(), bool((accept_index[b, n:] == -1).all()))
        if got != (n - 1, rows, True):
            out.append(
                f"{labels[b]}: SGLang accepted {accept_index[b, : int(num_correct[b]) + 1].tolist()}, reference {rows}"
            )
            continue
        if predict[rows].tolist() != emitted:
            out.append(f"{labels[b]}: SGLang predict {predict[rows].tolist()} != emitted {emitted}")
        for name, tokens, lens, bonus in steps:
            if (tokens[b, :n].tolist(), int(lens[b]), int(bonus[b])) != (emitted, n, ref.bonus):
                out.append(f"{labels[b]}: {name} {tokens[b, :n].tolist()} bonus {int(bonus[b])} != {emitted}")
    return out


def targets(t, paths, mode: str, seed: int) -> torch.Tensor:
    target = targets_for_paths(t.tree, paths, torch.Generator().manual_seed(seed))
    if mode == "greedy":
        return greedy_logits(target, torch.Generator().manual_seed(seed + 1)).argmax(dim=-1)
    logits = sampling_logits(target, torch.Generator().manual_seed(seed + 1))
    return sample_target_tokens(logits, 1.0, torch.Generator().manual_seed(seed + 2))


# Sibling depths: every one at budget 63; at budget 255 (SGLang's kernel in the interpreter costs
# about 0.15 s a deep request there) 1, 5, 8 and every one past 8.
PLANTED_DEPTHS = {63: tuple(range(1, DEPTH + 1)), 255: (1, 5, 8) + tuple(range(9, DEPTH + 1))}


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@pytest.mark.parametrize("k,budget", CONFIGS)
def test_sglang_acceptance_through_planted_siblings(sgl, k, budget, mode):
    """One request per sibling depth and rank (first, middle, last); the path goes through that
    sibling and ends half-way to the block's end, or at it (alternately)."""
    gen = torch.Generator().manual_seed(k * 1000 + budget)
    cases = [(d, r) for d in PLANTED_DEPTHS[budget] for r in RANKS]
    drafts = [planted_draft((d,), k, gen) for d, _ in cases]
    t, prefix = verify_tensors(drafts, budget, k, seed=budget)
    paths = []
    for b, (d, r) in enumerate(cases):
        end = DEPTH if b % 2 else d + (DEPTH - d) // 2
        lists = tree_lists(t.tree, b)
        path = planted_path(lists, drafts[b][1], [0] * (d - 1) + [rank_of(r, k)] + [0] * (end - d))
        assert lists.sibling_index(path[d]) == (rank_of(r, k), k)
        paths.append(path)
    target = targets(t, paths, mode, seed=k)
    labels = [f"sibling depth {d} rank {r}" for d, r in cases]
    got = sglang_accept(sgl, t, target)
    assert acceptance_mismatches(t, target, prefix, *got, labels) == []
    assert int(got[2].max()) == DEPTH


@pytest.mark.parametrize(
    "kind,most,mode",
    [
        ("deep_siblings", 16, "greedy"),
        ("deep_siblings", 16, "sampled"),
        ("wide_then_deep", 12, "greedy"),
        ("block_window", 16, "greedy"),
        ("block_window", 16, "sampled"),
    ],
)
def test_sglang_acceptance_to_deep_nodes(sgl, kind, most, mode):
    """Path ends at the tree's nodes past depth 8 (then shallower ones), ``most`` requests."""
    tree, all_paths = every_node_case(kind)
    deep = [b for b, p in enumerate(all_paths) if len(p) - 1 > 8]
    order = deep[:: max(1, len(deep) // most)][:most]
    # The same tree through the adapter: its drafts again, one request per path.
    make, budget, top_k, _ = TREE_KINDS[kind]
    drafts = make(torch.Generator().manual_seed(7)) * len(order)
    t, prefix = verify_tensors(drafts, budget, top_k, seed=1)
    assert torch.equal(t.tree.parents[0, : tree.num_slots], tree.parents[0])
    paths = [all_paths[b] for b in order]
    lists = tree_lists(t.tree, 0)
    assert any(lists.sibling_index(s)[0] > 0 for p in paths for s in p[1:])
    target = targets(t, paths, mode, seed=len(kind))
    labels = [f"path {p}" for p in paths]
    got = sglang_accept(sgl, t, target)
    assert acceptance_mismatches(t, target, prefix, *got, labels) == []
