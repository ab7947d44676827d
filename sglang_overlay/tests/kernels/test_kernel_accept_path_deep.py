"""The one-launch accepted path (Triton, in the interpreter on CPU) and the torch ``accepted_step``
against the brute-force reference walk, on paths down to the block's end (depth 15) through first,
middle and last siblings, greedy and sampled.

SGLang's acceptance hands the step ``accept_index`` (the flat verify rows of the root and the
accepted nodes, -1 after) and ``predict`` (the target's token after each row); here both come from
the reference walk, and the emitted tokens, bonus, path rows and positions must be the reference's.
Half the requests get ``predict`` as SGLang's greedy kernel leaves it (only the path's rows written,
0 elsewhere), the other half the target's token at every row."""

from __future__ import annotations

import os

import pytest
import torch
from deep_trees import (
    CONFIGS,
    DEPTH,
    RANKS,
    TREE_KINDS,
    every_node_case,
    greedy_logits,
    planted_case,
    references,
    replicate,
    sampling_logits,
    targets_for_paths,
    tree_lists,
)

from sglang_overlay.adapter.tree_verify import accepted_step
from sglang_overlay.core.tree import DDTreeBatch
from sglang_overlay.core.walk import sample_target_tokens
from sglang_overlay.kernels import accept_path as ap

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and ap.accept_path_available()


def planted_batch(k: int, budget: int) -> tuple[DDTreeBatch, list[list[int]]]:
    """Every planted depth and sibling rank, the path ending at the sibling, half-way down and at 15."""
    trees, paths = [], []
    for depth in range(1, DEPTH + 1):
        for rank in RANKS:
            tree, ps = planted_case(k, budget, depth, rank)
            keep = sorted({0, (len(ps) - 1) // 2, len(ps) - 1})
            trees.append(replicate(tree, keep))
            paths.extend(ps[i] for i in keep)
    return DDTreeBatch(*(torch.cat([getattr(t, f) for t in trees]) for f in DDTreeBatch.__dataclass_fields__)), paths


def every_node_batch(kind: str, most: int = 96) -> tuple[DDTreeBatch, list[list[int]]]:
    """Path ends at the tree's nodes: all past depth 8 first, then others, ``most`` in all."""
    tree, paths = every_node_case(kind)
    order = sorted(range(len(paths)), key=lambda b: (len(paths[b]) <= 9, b))[:most]
    return replicate(tree, order), [paths[b] for b in order]


CASES = [f"planted_k{k}_b{b}" for k, b in CONFIGS] + list(TREE_KINDS)


def case_batch(case: str) -> tuple[DDTreeBatch, list[list[int]]]:
    if case.startswith("planted_"):
        k, b = (int(x[1:]) for x in case.split("_")[1:])
        return planted_batch(k, b)
    return every_node_batch(case)


def sglang_outputs(tree: DDTreeBatch, target: torch.Tensor):
    """``(predict, accept_index, accept_lens, refs)`` as SGLang's tree acceptance returns them."""
    bs, width = tree.batch_size, tree.num_slots
    refs = references(tree, target)
    predict = torch.zeros(bs * width, dtype=torch.int32)
    accept_index = torch.full((bs, width), -1, dtype=torch.int32)
    for b, ref in enumerate(refs):
        rows = [b * width + s for s in ref.path]
        accept_index[b, : len(rows)] = torch.tensor(rows, dtype=torch.int32)
        if b % 2:
            predict[b * width : (b + 1) * width] = target[b].to(torch.int32)
        else:
            predict[rows] = target[b, ref.path].to(torch.int32)
    accept_lens = torch.tensor([len(r.path) for r in refs], dtype=torch.int32)
    return predict, accept_index, accept_lens, refs


def step_mismatches(tree, refs, prefix, out_tokens, lens, bonus, path_rows, path_positions) -> list[str]:
    bs, width = tree.batch_size, tree.num_slots
    out = []
    for b, ref in enumerate(refs):
        lists = tree_lists(tree, b)
        n = len(ref.path)
        emitted = [lists.tokens[s] for s in ref.path[1:]] + [ref.bonus]
        got = (out_tokens[b].tolist(), int(lens[b]), int(bonus[b]), path_rows[b, :n].tolist())
        want = (emitted + [0] * (width - n), n, ref.bonus, [b * width + s for s in ref.path])
        if got != want:
            out.append(f"request {b} (path {ref.path}): got {got[1:]}, tokens {got[0][:n]}; want {want[1:]}, {emitted}")
        rows = path_rows[b]
        if not bool(((rows >= 0) & (rows < bs * width)).all()):
            out.append(f"request {b}: path rows out of range: {rows.tolist()}")
        if path_positions[b].tolist() != list(range(int(prefix[b]), int(prefix[b]) + width)):
            out.append(f"request {b}: positions {path_positions[b].tolist()}")
    return out


def target_tokens(tree: DDTreeBatch, paths, mode: str, seed: int) -> torch.Tensor:
    target = targets_for_paths(tree, paths, torch.Generator().manual_seed(seed))
    if mode == "greedy":
        return greedy_logits(target, torch.Generator().manual_seed(seed + 1)).argmax(dim=-1)
    logits = sampling_logits(target, torch.Generator().manual_seed(seed + 1))
    return sample_target_tokens(logits, 1.0, torch.Generator().manual_seed(seed + 2))


@pytest.mark.parametrize("impl", ["kernel", "torch"])
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@pytest.mark.parametrize("case", CASES)
def test_the_accepted_path_follows_the_reference(case, mode, impl):
    if impl == "kernel" and not INTERPRETED:
        pytest.skip("needs triton with TRITON_INTERPRET=1 (CPU)")
    tree, paths = case_batch(case)
    target = target_tokens(tree, paths, mode, seed=len(case))
    predict, accept_index, accept_lens, refs = sglang_outputs(tree, target)
    assert max(r.accept_len for r in refs) >= 14  # down to the block's end
    prefix = torch.randint(0, 4000, (tree.batch_size,), generator=torch.Generator().manual_seed(3))
    if impl == "kernel":
        got = ap.accept_path(predict, accept_index, accept_lens, prefix)
    else:
        step = accepted_step(predict, accept_index, accept_lens, prefix)
        got = (step.out_tokens, step.accept_lens, step.bonus, step.path_rows, step.path_positions)
    assert step_mismatches(tree, refs, prefix, *got) == []
