"""Deep trees, planted paths and a brute-force reference walk for the "lossless at every depth" tests.

The reference is written from the definition alone, on plain Python lists, and shares no code with
``core.walk``, ``kernels.accept_path`` or the verify links: start at the root (slot 0); the target's
token at the current slot picks the child carrying it (the smallest such slot); stop when no child
carries it, and that token is the bonus.

The trees come from the real builder (``core.tree.build_tree_batched``) fed planted per-position
distributions, so that the paths the tests walk reach the block's end (depth 15 for a block of 16)
and go through the first, a middle and the last sibling at chosen depths.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from sglang_overlay.core.lattice import build_lattice_tree_batched
from sglang_overlay.core.tree import DDTreeBatch, build_tree_batched

BLOCK = 16  # the DFlash block: the root and up to 15 drafted positions
DEPTH = BLOCK - 1
VOCAB = 24  # small: tokens repeat across positions (a walk must follow parents, not tokens alone)
RANKS = ("first", "middle", "last")


# ---- the reference ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    path: list[int]  # slot 0, then the accepted slots
    bonus: int

    @property
    def accept_len(self) -> int:
        return len(self.path) - 1


@dataclass(frozen=True)
class TreeLists:
    """One request's tree as lists (slots ``0..num_nodes``), with brute-force relations."""

    tokens: list[int]
    parents: list[int]

    @property
    def num_slots(self) -> int:
        return len(self.tokens)

    @functools.cached_property
    def _kids(self) -> dict[int, list[int]]:
        kids: dict[int, list[int]] = {s: [] for s in range(self.num_slots)}
        for c in range(1, self.num_slots):
            kids[self.parents[c]].append(c)
        return kids

    def children(self, slot: int) -> list[int]:
        """``slot``'s children in slot order (a fresh list)."""
        return list(self._kids.get(slot, []))

    def ancestors(self, slot: int) -> list[int]:
        """Root first, ``slot`` last."""
        chain = [slot]
        while chain[-1] != 0:
            chain.append(self.parents[chain[-1]])
        return chain[::-1]

    def depth(self, slot: int) -> int:
        return len(self.ancestors(slot)) - 1

    def sibling_index(self, slot: int) -> tuple[int, int]:
        """``(i, m)``: ``slot`` is child ``i`` of the ``m`` children of its parent, in slot order."""
        kids = self.children(self.parents[slot])
        return kids.index(slot), len(kids)


def tree_lists(tree: DDTreeBatch, b: int) -> TreeLists:
    n = int(tree.num_nodes[b]) + 1
    return TreeLists(tree.tokens[b, :n].tolist(), tree.parents[b, :n].tolist())


def reference_walk(tree: TreeLists, target: list[int]) -> Reference:
    """The accepted path and bonus for the target's token ``target[slot]`` at every slot."""
    path = [0]
    while True:
        want = int(target[path[-1]])
        hits = [c for c in tree.children(path[-1]) if tree.tokens[c] == want]
        if not hits:
            return Reference(path, want)
        path.append(min(hits))


def references(tree: DDTreeBatch, target: torch.Tensor) -> list[Reference]:
    return [reference_walk(tree_lists(tree, b), target[b].tolist()) for b in range(tree.batch_size)]


def walk_mismatches(tree: DDTreeBatch, target: torch.Tensor, walk) -> list[str]:
    """Where a ``core.walk.WalkResult`` differs from the reference, one line per request."""
    out = []
    width = walk.path_slots.shape[1]
    for b, ref in enumerate(references(tree, target)):
        lists = tree_lists(tree, b)
        m = ref.accept_len
        want_path = ref.path + [-1] * (width - len(ref.path))
        accepted = [lists.tokens[s] for s in ref.path[1:]]
        want_acc = accepted + [-1] * (width - 1 - m)
        want_emit = accepted + [ref.bonus] + [-1] * (width - 1 - m)
        got = (
            walk.path_slots[b].tolist(),
            int(walk.accept_len[b]),
            walk.accepted_tokens[b].tolist(),
            int(walk.bonus[b]),
            walk.emitted_tokens[b].tolist(),
        )
        if got != (want_path, m, want_acc, ref.bonus, want_emit):
            out.append(
                f"request {b}: walk path {got[0][: got[1] + 1]} bonus {got[3]}, "
                f"reference path {ref.path} (depth {m}, sibling ranks {path_sibling_ranks(lists, ref.path)}) "
                f"bonus {ref.bonus}"
            )
    return out


def path_sibling_ranks(tree: TreeLists, path: list[int]) -> list[int]:
    return [tree.sibling_index(s)[0] for s in path[1:]]


# ---- trees ----------------------------------------------------------------------------------------


def planted_draft(
    sibling_depths: tuple[int, ...], k: int, gen: torch.Generator, depth_limit: int = DEPTH
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[L, k]`` log-probs and token ids of a drafter that is sure except at ``sibling_depths``.

    At a sibling depth the ``k`` candidates are nearly equal (-0.05 apart), elsewhere the top
    candidate has -0.01 and the others -8 and below. Best-first then takes every full-depth chain
    through the sibling levels (all ``k`` siblings at each, slot order = rank order) before any
    unlikely node; the rest of the budget goes to unlikely nodes (deep second siblings and so on).
    Token ids: ``k`` distinct ids per position from a small vocabulary, so ids repeat across depths.
    """
    lp = torch.empty(depth_limit, k)
    ids = torch.empty(depth_limit, k, dtype=torch.int64)
    for i in range(depth_limit):
        if i + 1 in sibling_depths:
            lp[i] = -0.05 * torch.arange(k, dtype=torch.float32)
        else:
            lp[i, 0] = -0.01
            lp[i, 1:] = -8.0 - 0.5 * torch.arange(k - 1, dtype=torch.float32)
        ids[i] = torch.randperm(VOCAB, generator=gen)[:k]
    return lp, ids


def peaked_draft(k: int, gen: torch.Generator, depth_limit: int = DEPTH) -> tuple[torch.Tensor, torch.Tensor]:
    """``[L, k]`` top-k of a plausible drafter: a confident but noisy distribution per position."""
    logits = torch.randn(depth_limit, VOCAB, generator=gen) * 1.5
    logits[torch.arange(depth_limit), torch.randint(0, VOCAB, (depth_limit,), generator=gen)] += 8.0
    lp = torch.log_softmax(logits, dim=-1)
    lp, ids = torch.sort(lp, dim=-1, descending=True, stable=True)
    return lp[:, :k].contiguous(), ids[:, :k].contiguous()


def build(drafts: list[tuple[torch.Tensor, torch.Tensor]], budget: int, top_k: int, roots=None) -> DDTreeBatch:
    """One request per ``(lp, ids)`` through the real batched builder."""
    lp = torch.stack([d[0] for d in drafts])
    ids = torch.stack([d[1] for d in drafts])
    if roots is None:
        roots = torch.arange(len(drafts)) % VOCAB
    return build_tree_batched(lp, ids, budget, top_k_cap=top_k, root_tokens=roots)


def replicate(tree: DDTreeBatch, picks: list[int]) -> DDTreeBatch:
    """A batch of requests ``picks`` of ``tree`` (repeats allowed)."""
    idx = torch.tensor(picks, dtype=torch.int64)
    return DDTreeBatch(
        tokens=tree.tokens[idx].clone(),
        parents=tree.parents[idx].clone(),
        depths=tree.depths[idx].clone(),
        ranks=tree.ranks[idx].clone(),
        scores=tree.scores[idx].clone(),
        num_nodes=tree.num_nodes[idx].clone(),
    )


def planted_path(tree: TreeLists, ids: torch.Tensor, ranks: list[int]) -> list[int]:
    """The slots of the path whose node at depth ``d`` is ``ids[d - 1][ranks[d - 1]]``'s (root first)."""
    path = [0]
    for d, r in enumerate(ranks, start=1):
        want = int(ids[d - 1, r])
        hits = [c for c in tree.children(path[-1]) if tree.tokens[c] == want]
        assert len(hits) == 1, f"the planted node of rank {r} at depth {d} is not in the tree"
        path.append(hits[0])
    return path


def rank_of(kind: str, k: int) -> int:
    return {"first": 0, "middle": (k - 1) // 2 if k > 2 else 1, "last": k - 1}[kind]


# ---- the target ---------------------------------------------------------------------------------


def targets_for_paths(tree: DDTreeBatch, paths: list[list[int]], gen: torch.Generator) -> torch.Tensor:
    """``[B, n]`` target tokens: request ``b`` accepts ``paths[b]`` (root first) and stops at its end.

    On the path the target's token is the next node's; at the end, a token no child carries (the
    bonus); elsewhere (never visited) random tokens.
    """
    out = torch.randint(0, VOCAB, (tree.batch_size, tree.num_slots), generator=gen)
    for b, path in enumerate(paths):
        lists = tree_lists(tree, b)
        for here, nxt in zip(path[:-1], path[1:]):
            assert lists.parents[nxt] == here, f"request {b}: {path} is not a path"
            out[b, here] = lists.tokens[nxt]
        taken = {lists.tokens[c] for c in lists.children(path[-1])}
        free = [t for t in range(VOCAB) if t not in taken]
        out[b, path[-1]] = free[int(torch.randint(0, len(free), (), generator=gen))]
    return out


def greedy_logits(target: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``[B, n, V]`` logits whose argmax at every slot is ``target`` (random elsewhere)."""
    logits = torch.rand(*target.shape, VOCAB, generator=gen)
    return logits.scatter(2, target[..., None], 2.0)


def sampling_logits(target: torch.Tensor, gen: torch.Generator, boost: float = 7.0) -> torch.Tensor:
    """``[B, n, V]`` logits that favour ``target`` at every slot without forcing it (p about 0.98 at
    ``boost`` 7, V = 24): most sampled walks follow the planned paths to the block's end, some leave
    them at any depth, into other siblings or to an early bonus."""
    logits = torch.randn(*target.shape, VOCAB, generator=gen) * 0.5
    return logits.scatter_add(2, target[..., None], torch.full((*target.shape, 1), boost))


# ---- the cases the deep tests share ------------------------------------------------------------

# (top_k, budget): the widest tree the settings allow for a block of 16 at budget 255, and a narrow one.
CONFIGS = [(8, 255), (3, 63)]


@functools.cache
def planted_trees(k: int, budget: int) -> tuple[DDTreeBatch, list[torch.Tensor]]:
    """Request ``d - 1`` has its sibling level at depth ``d`` (1..15); also returns each one's ids."""
    gen = torch.Generator().manual_seed(1000 * k + budget)
    drafts = [planted_draft((d,), k, gen) for d in range(1, DEPTH + 1)]
    return build(drafts, budget, k), [ids for _, ids in drafts]


def planted_case(k: int, budget: int, depth: int, rank: str, copies: int = 1):
    """Requests that accept the path through sibling ``rank`` at ``depth``, ending at every depth
    from ``depth`` to 15 (each ``copies`` times)."""
    trees, ids = planted_trees(k, budget)
    lists = tree_lists(trees, depth - 1)
    r = rank_of(rank, k)
    ends = [a for a in range(depth, DEPTH + 1) for _ in range(copies)]
    paths = [planted_path(lists, ids[depth - 1], [0] * (depth - 1) + [r] + [0] * (a - depth)) for a in ends]
    node = paths[0][depth]
    index, siblings = lists.sibling_index(node)
    assert siblings == k and index == r, "the planted level has all k siblings in rank order"
    assert lists.depth(paths[-1][-1]) == DEPTH  # the longest path reaches the block's end
    return replicate(trees, [depth - 1] * len(paths)), paths


# name -> (drafts, budget, top_k, the deepest node): wide then deep; siblings deep down; a plausible
# drafter; the real block-sized verify window (budget 15: a deep chain with a sibling past depth 8).
TREE_KINDS = {
    "wide_then_deep": (lambda g: [planted_draft((1, 2), 8, g)], 255, 8, DEPTH),
    "deep_siblings": (lambda g: [planted_draft((9, 12, 15), 4, g)], 255, 4, DEPTH),
    "peaked_drafter": (lambda g: [peaked_draft(8, g)], 255, 8, DEPTH),
    "block_window": (lambda g: [planted_draft((9,), 2, g)], 15, 2, 14),
}


@functools.cache
def every_node_case(kind: str) -> tuple[DDTreeBatch, list[list[int]]]:
    make, budget, top_k, _ = TREE_KINDS[kind]
    tree = build(make(torch.Generator().manual_seed(7)), budget, top_k)
    lists = tree_lists(tree, 0)
    paths = [lists.ancestors(s) for s in range(lists.num_slots)]
    return replicate(tree, [0] * len(paths)), paths


@functools.cache
def lattice_every_node_case(k: int = 4, budget: int = 255) -> tuple[DDTreeBatch, list[list[int]]]:
    """A DFlash2 lattice tree (``core.lattice``) with every node the end of one request's path: each
    candidate's row favours one candidate of the next slot, which one depending on the parent, so the
    tree goes to the block's end along several chains and branches below depth 8."""
    gen = torch.Generator().manual_seed(17)
    ids = torch.randint(0, VOCAB, (1, DEPTH, k), generator=gen)
    scores = torch.randn(1, DEPTH, k, k, generator=gen)
    favoured = (torch.arange(k).view(1, k) + torch.arange(DEPTH).view(DEPTH, 1)) % k  # [E, parent]
    scores[0].scatter_add_(2, favoured.unsqueeze(-1), torch.full((DEPTH, k, 1), 5.0))
    tree = build_lattice_tree_batched(ids, scores, budget, top_k_cap=k, root_tokens=torch.tensor([3]))
    lists = tree_lists(tree, 0)
    paths = [lists.ancestors(s) for s in range(lists.num_slots)]
    return replicate(tree, [0] * len(paths)), paths


def deep_coverage(lists: TreeLists, paths: list[list[int]]) -> dict[str, int]:
    """Path ends past depth 8: with children (where taking the first child would go on), through a
    non-first sibling anywhere, and through a non-first sibling past depth 8; the deepest end."""
    past8 = [p for p in paths if len(p) - 1 > 8]
    return {
        "deepest": max(len(p) - 1 for p in paths),
        "past8_with_children": sum(1 for p in past8 if lists.children(p[-1])),
        "past8_non_first": sum(1 for p in past8 if any(lists.sibling_index(s)[0] > 0 for s in p[1:])),
        "non_first_past8": sum(1 for p in past8 if any(lists.sibling_index(s)[0] > 0 for s in p[9:])),
    }
