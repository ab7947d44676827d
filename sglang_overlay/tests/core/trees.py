"""Random trees and target tokens shared by the core tests."""

from __future__ import annotations

import random

import torch

from sglang_overlay.core.heap import build_tree_heap
from sglang_overlay.core.tree import DDTreeBatch, heap_trees_to_batch


def random_tree_batch(
    rng: random.Random, batch: int, depth_limit: int, width: int, budget: int, vocab: int = 50
) -> DDTreeBatch:
    """A batch whose requests have different node counts (each its own budget <= ``budget``)."""
    trees = []
    for _ in range(batch):
        lp = [sorted((-rng.expovariate(1.0) for _ in range(width)), reverse=True) for _ in range(depth_limit)]
        ids = [rng.sample(range(vocab), width) for _ in range(depth_limit)]
        trees.append(build_tree_heap(lp, ids, rng.randint(0, budget)))
    roots = [rng.randrange(vocab) for _ in range(batch)]
    return heap_trees_to_batch(trees, budget, roots)


def children_of(tree: DDTreeBatch, b: int) -> dict[int, list[int]]:
    req = tree.request(b)
    kids: dict[int, list[int]] = {i: [] for i in range(len(req["parents"]))}
    for i, p in enumerate(req["parents"]):
        if i > 0:
            kids[p].append(i)
    return kids


def walk_friendly_targets(
    rng: random.Random, tree: DDTreeBatch, vocab: int = 50, p_child: float = 0.75
) -> torch.Tensor:
    """``[B, n]`` target tokens: often a child's token (so walks go deep), else a random token."""
    out = torch.zeros(tree.batch_size, tree.num_slots, dtype=torch.int64)
    for b in range(tree.batch_size):
        kids = children_of(tree, b)
        for i in range(tree.num_slots):
            if kids.get(i) and rng.random() < p_child:
                out[b, i] = int(tree.tokens[b, rng.choice(kids[i])])
            else:
                out[b, i] = rng.randrange(vocab)
    return out


def naive_walk(tree: DDTreeBatch, target: torch.Tensor, b: int) -> tuple[list[int], int]:
    """Accepted slots (root first) and the bonus token, walking one request by hand."""
    kids = children_of(tree, b)
    path, cur = [0], 0
    while True:
        want = int(target[b, cur])
        nxt = [c for c in kids.get(cur, []) if int(tree.tokens[b, c]) == want]
        if not nxt:
            return path, want
        cur = min(nxt)
        path.append(cur)
