"""A planted accepted path: the step-cost benchmark's instrument (``knobs.PLANT_PATH``), never for serving.

The cost of a tree step after the verify (the acceptance, the path's KV move, the drafter's KV writes,
the next step's inputs) may depend on which path the target accepts: a chain in the window's first
slots, or a path through later siblings. Real text decides that path; to measure each kind on any bed,
random weights included, the benchmark replaces the acceptance's result with a path chosen by rule:
from the root, ``depth`` times, the ``first``, ``middle`` or ``last`` child (in slot order, which is
the best-first order: a node's children are popped by decreasing score), stopping where a node has no
child. ``predict`` at each path node becomes its chosen child's token, so every later part of the step
(``accepted_step``, the commit) sees a consistent accepted path. The output is then the drafter's, not
the target's: lossy by design, a measurement switch only.

One program per request (``W`` slots as a vector, one pass per depth), no host synchronisation, so it
adds the same few microseconds to every planted step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

try:  # triton is optional: without it the torch code runs.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

__all__ = ["PathPlant", "parse_plant", "plant_path", "plant_path_torch", "PlantSource", "RANKS"]

#: Which child a planted path takes at each depth, by name -> the kernel's code.
RANKS = {"first": 0, "middle": 1, "last": 2}


@dataclass(frozen=True)
class PathPlant:
    """A planted path: ``depth`` nodes at most below the root, each the ``rank`` child of the one before."""

    rank: str
    depth: int

    def __str__(self) -> str:
        return f"{self.rank} {self.depth}"


def parse_plant(text: str) -> Optional[PathPlant]:
    """``"RANK DEPTH"`` (RANK one of first/middle/last, DEPTH >= 1) -> a plant; ``"none"``/empty -> None.

    Raises ValueError naming the bad part and the accepted forms.
    """
    words = text.split()
    if not words or words == ["none"]:
        return None
    if len(words) != 2 or words[0] not in RANKS:
        raise ValueError(f"{text!r}: expected 'RANK DEPTH' with RANK one of {', '.join(RANKS)}, or 'none'")
    try:
        depth = int(words[1])
    except ValueError:
        raise ValueError(f"{text!r}: DEPTH {words[1]!r} is not an integer") from None
    if depth < 1:
        raise ValueError(f"{text!r}: DEPTH must be at least 1")
    return PathPlant(words[0], depth)


class PlantSource:
    """The plant a knob's value names: ``RANK DEPTH`` itself, or ``@FILE`` whose text is re-read when the
    file's modification time changes (one server then measures every plant in turn). A file that is
    missing or does not parse plants nothing."""

    def __init__(self, value: str):
        self.file = value[1:] if value.startswith("@") else None
        self._stamp = None
        self._plant = None if self.file else parse_plant(value)

    def current(self) -> Optional[PathPlant]:
        if self.file is None:
            return self._plant
        try:
            stamp = os.stat(self.file).st_mtime_ns
        except OSError:
            return None
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                with open(self.file, encoding="utf-8") as fh:
                    self._plant = parse_plant(fh.read())
            except (OSError, ValueError):
                self._plant = None
        return self._plant


if triton is not None:

    @triton.jit
    def _plant_path_kernel(
        parents_ptr,  # [bs, W] parent slot of every slot (-1: root, padding)
        tokens_ptr,  # [bs, W] every slot's token
        predict_ptr,  # [bs * W] the target's token after every verify row (rewritten on the path)
        accept_index_ptr,  # [bs, W] flat rows of the path (rewritten; -1 after it)
        accept_lens_ptr,  # [bs] path nodes + 1 (rewritten)
        W,
        depth,
        RANK: tl.constexpr,  # 0 first, 1 middle, 2 last
        W_P2: tl.constexpr,
        MAX_DEPTH: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        s = tl.arange(0, W_P2)
        valid = s < W
        parents = tl.load(parents_ptr + b * W + s, mask=valid, other=-1).to(tl.int32)
        tokens = tl.load(tokens_ptr + b * W + s, mask=valid, other=0)
        node = tl.zeros((), dtype=tl.int32)
        length = tl.full((), 1, dtype=tl.int32)
        alive = depth > 0
        for d in range(1, MAX_DEPTH + 1):
            children = valid & (s > 0) & (parents == node)
            count = tl.sum(children.to(tl.int32), axis=0)
            if RANK == 0:
                want = 0
            elif RANK == 1:
                want = (count - 1) // 2
            else:
                want = count - 1
            order = tl.cumsum(children.to(tl.int32), axis=0) - 1
            pick = children & (order == want)
            child = tl.sum(tl.where(pick, s, 0), axis=0).to(tl.int32)
            token = tl.sum(tl.where(pick, tokens, 0), axis=0)
            go = alive & (count > 0) & (d <= depth)
            tl.store(predict_ptr + b * W + node, token.to(predict_ptr.dtype.element_ty), mask=go)
            tl.store(
                accept_index_ptr + b * W + d, (b * W + child).to(accept_index_ptr.dtype.element_ty), mask=go & (d < W)
            )
            length = tl.where(go, d + 1, length)
            node = tl.where(go, child, node)
            alive = go
        row = tl.arange(0, W_P2)
        clear = valid & (row >= length)
        tl.store(
            accept_index_ptr + b * W + row,
            tl.full((W_P2,), -1, tl.int32).to(accept_index_ptr.dtype.element_ty),
            mask=clear,
        )
        tl.store(accept_index_ptr + b * W, (b * W).to(accept_index_ptr.dtype.element_ty))
        tl.store(accept_lens_ptr + b, length.to(accept_lens_ptr.dtype.element_ty))


def plant_path(
    parents: torch.Tensor,
    tokens: torch.Tensor,
    predict: torch.Tensor,
    accept_index: torch.Tensor,
    accept_lens: torch.Tensor,
    plant: PathPlant,
    max_depth: int,
) -> None:
    """Rewrite the acceptance's outputs in place to the planted path (see the module docstring).

    ``parents``/``tokens``: ``[bs, W]`` the padded trees; ``predict`` ``[bs * W]``, ``accept_index``
    ``[bs, W]``, ``accept_lens`` ``[bs]`` as ``eagle_sample`` returns them; ``max_depth``: the deepest
    tree (the drafter's block minus the root). A Triton launch on CUDA, the torch code elsewhere.
    """
    bs, window = (int(d) for d in parents.shape)
    if bs == 0:
        return
    if not (parents.is_cuda and triton is not None) and os.environ.get("TRITON_INTERPRET") != "1":
        plant_path_torch(parents, tokens, predict, accept_index, accept_lens, plant)
        return
    _plant_path_kernel[(bs,)](
        parents,
        tokens,
        predict,
        accept_index,
        accept_lens,
        window,
        min(int(plant.depth), int(max_depth)),
        RANK=RANKS[plant.rank],
        W_P2=1 << max(0, window - 1).bit_length(),
        MAX_DEPTH=max(1, min(int(max_depth), window - 1)),
    )


def plant_path_torch(
    parents: torch.Tensor,
    tokens: torch.Tensor,
    predict: torch.Tensor,
    accept_index: torch.Tensor,
    accept_lens: torch.Tensor,
    plant: PathPlant,
) -> None:
    """The reference: the same rewrite, request by request, on the host."""
    bs, window = (int(d) for d in parents.shape)
    for b in range(bs):
        par = parents[b].tolist()
        node, path = 0, [0]
        for _d in range(int(plant.depth)):
            children = [s for s in range(1, window) if par[s] == node]
            if not children:
                break
            pick = {"first": 0, "middle": (len(children) - 1) // 2, "last": len(children) - 1}[plant.rank]
            child = children[pick]
            predict[b * window + node] = tokens[b, child]
            path.append(child)
            node = child
        accept_index[b] = -1
        accept_index[b, : len(path)] = torch.tensor([b * window + s for s in path], dtype=accept_index.dtype)
        accept_lens[b] = len(path)
