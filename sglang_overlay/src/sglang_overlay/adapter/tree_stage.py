"""The tree stage of a DDTree decode step, replayed from one CUDA graph per batch size.

The stage is everything between the drafter's hidden states and the target's verify input whose
shapes depend only on the batch size: the drafter rows through the target LM head, the fused draft
top-k, the tree kernel, the padding to the verify window, SGLang's verify links, the positions,
the ancestor masks and the scatter positions of the FULL mask's tree blocks
(``tree_verify.tree_layout``). Run eagerly that is about 60 kernel launches and their Python, every
step, outside the target's graphs: on a small model the step is bound by that host work (issue 19
measured DDTREE's step at 8.7 ms against DFLASH's 5.4 ms). In a graph it is three input copies and
one replay. What stays eager is only what has a per-step size: the FULL mask (``prefix + W``
columns per row; two launches with the graph's scatter positions).

Same kernels in the graph as eagerly, so the same tree, bit for bit (the GPU test compares them);
the outputs are the graph's static tensors, rewritten by the next replay of the same batch size,
which the next step enqueues on the same stream after this step's readers.

Torch only; capture needs CUDA (``GraphedTreeStage`` falls back to the eager function elsewhere).
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Optional

import torch

from .tree_verify import TreeLayout

logger = logging.getLogger(__name__)

#: ``DDTREE_EAGER_TREE_STAGE=1`` in a server's environment: run the tree stage eagerly every step
#: (as releases before it did). For A/B measurements, not for operators.
EAGER_STAGE_ENV = "DDTREE_EAGER_TREE_STAGE"

StageFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], TreeLayout]


def eager_tree_stage() -> bool:
    return os.environ.get(EAGER_STAGE_ENV, "") == "1"


class _Captured:
    __slots__ = ("graph", "hidden", "roots", "prefix", "out")

    def __init__(self, graph, hidden, roots, prefix, out):
        self.graph, self.hidden, self.roots, self.prefix, self.out = graph, hidden, roots, prefix, out


class GraphedTreeStage:
    """``stage(hidden, root_tokens, prefix_lens) -> TreeLayout``, captured per input shape on first use.

    Args:
        stage: the eager stage, a pure function of its three tensor arguments (no host sync, no
            data-dependent shapes: ``tree_verify.tree_layout`` after the draft top-k).
        max_batch: batches larger than this run eagerly (bounds the graphs' memory pool, which
            holds the largest ``[bs * L, V]`` draft logits).
        enabled: False runs every call eagerly.

    All graphs share one memory pool (their replays never overlap; each output stays referenced
    here, so a later capture never reuses it). A capture that fails is logged once and that shape
    runs eagerly from then on.
    """

    def __init__(self, stage: StageFn, max_batch: int, enabled: bool = True):
        self.stage = stage
        self.max_batch = int(max_batch)
        self.enabled = bool(enabled)
        self._graphs: dict[tuple, Optional[_Captured]] = {}
        self._pool = None

    @property
    def captured_shapes(self) -> list[tuple]:
        return [key for key, entry in self._graphs.items() if entry is not None]

    def __call__(self, hidden: torch.Tensor, root_tokens: torch.Tensor, prefix_lens: torch.Tensor) -> TreeLayout:
        bs = int(hidden.shape[0])
        if not self.enabled or not hidden.is_cuda or bs == 0 or bs > self.max_batch:
            return self.stage(hidden, root_tokens, prefix_lens)
        key = (tuple(hidden.shape), hidden.dtype, root_tokens.dtype, prefix_lens.dtype)
        if key not in self._graphs:
            self._graphs[key] = self._capture(key, hidden, root_tokens, prefix_lens)
        entry = self._graphs[key]
        if entry is None:
            return self.stage(hidden, root_tokens, prefix_lens)
        entry.hidden.copy_(hidden)
        entry.roots.copy_(root_tokens.reshape(entry.roots.shape))
        entry.prefix.copy_(prefix_lens)
        entry.graph.replay()
        return entry.out

    def _capture(self, key, hidden, root_tokens, prefix_lens) -> Optional[_Captured]:
        static = (hidden.clone(), root_tokens.reshape(-1).clone(), prefix_lens.clone())
        try:
            # Warm up on a side stream (Triton compiles, cuBLAS picks its kernels) outside the capture.
            side = torch.cuda.Stream(device=hidden.device)
            side.wait_stream(torch.cuda.current_stream(hidden.device))
            with torch.cuda.stream(side):
                self.stage(*static)
            torch.cuda.current_stream(hidden.device).wait_stream(side)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                out = self.stage(*static)
        except Exception:  # noqa: BLE001 (a shape that cannot be captured still runs, eagerly)
            logger.exception("DDTREE: could not capture the tree stage for %s; it runs eagerly", key)
            return None
        logger.info("DDTREE tree stage: captured a CUDA graph for batch size %d", key[0][0])
        return _Captured(graph, *static, out)
