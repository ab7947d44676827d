"""Inputs shared by the kernel tests (CPU interpreter and GPU)."""

from __future__ import annotations

import torch

from sglang_overlay.core.heap import build_tree_heap
from sglang_overlay.core.tree import DDTreeBatch, heap_trees_to_batch

TIE_LEVELS = torch.tensor([0.0, -0.5, -0.5, -1.0, -1.5, -3.0])


def make_inputs(gen: torch.Generator, batch: int, depth_limit: int, width: int, kind: str = "random"):
    """``[B, L, K]`` descending log-probs and token ids.

    kinds: ``random`` (log_softmax of Gaussian logits, top slice), ``ties`` (few distinct values:
    many exact ties within and across positions), ``zeros`` (every score 0: pure rank-tuple order,
    deep chains that exercise every key word), ``neginf`` (ties plus -inf entries and whole -inf
    rows).
    """
    shape = (batch, depth_limit, width)
    if kind == "random":
        lp = torch.log_softmax(torch.randn(batch, depth_limit, max(width, 2) * 3, generator=gen) * 2, -1)[..., :width]
    elif kind == "ties":
        lp = TIE_LEVELS[torch.randint(0, len(TIE_LEVELS), shape, generator=gen)]
    elif kind == "zeros":
        lp = torch.zeros(shape)
    elif kind == "neginf":
        lp = TIE_LEVELS[torch.randint(0, len(TIE_LEVELS), shape, generator=gen)]
        lp = torch.where(torch.rand(shape, generator=gen) < 0.3, torch.tensor(float("-inf")), lp)
        if depth_limit > 1:
            lp[:, depth_limit // 2, :] = float("-inf")
    else:
        raise ValueError(kind)
    lp = lp.sort(dim=-1, descending=True).values.contiguous()
    ids = torch.randint(0, 150_000, shape, generator=gen)
    return lp, ids


def heap_batch(lp: torch.Tensor, ids: torch.Tensor, budget: int, cap, roots) -> DDTreeBatch:
    lp_c, ids_c = lp.cpu(), ids.cpu()
    trees = [build_tree_heap(lp_c[b].tolist(), ids_c[b].tolist(), budget, cap) for b in range(lp.shape[0])]
    return heap_trees_to_batch(trees, budget, None if roots is None else roots.cpu())


def first_mismatch(got: DDTreeBatch, want: DDTreeBatch) -> str:
    got, want = got.to("cpu"), want.to("cpu")
    for f in ("tokens", "parents", "depths", "ranks", "scores", "num_nodes"):
        a, b = getattr(got, f), getattr(want, f)
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{f}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    for r in range(want.batch_size):
        for f in ("tokens", "parents", "depths", "ranks", "scores"):
            a, b = getattr(got, f)[r], getattr(want, f)[r]
            if f == "scores":
                a, b = a.view(torch.int32), b.view(torch.int32)
            if not torch.equal(a, b):
                i = int((a != b).nonzero()[0])
                return (
                    f"request {r} field {f} slot {i}: kernel {getattr(got, f)[r, i].item()} vs "
                    f"oracle {getattr(want, f)[r, i].item()}\n kernel {got.request(r)}\n oracle {want.request(r)}"
                )
    return f"num_nodes: {got.num_nodes.tolist()} vs {want.num_nodes.tolist()}"
