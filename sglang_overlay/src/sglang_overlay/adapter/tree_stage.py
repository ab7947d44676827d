"""The tree stage of a DDTree decode step, replayed from one CUDA graph per batch size.

The stage is everything between the drafter's hidden states and the target's verify input whose
shapes depend only on the batch size: the drafter rows through the target LM head, the fused draft
top-k, the tree kernel, the padding to the verify window, SGLang's verify links, the positions,
the ancestor masks, the scatter positions of the FULL mask's tree blocks and, where the target's
attention backend has a verify-mask buffer that reads SGLang's FULL layout (``backend_mask_buffer``),
the whole FULL mask written into that buffer (``tree_step.tree_stage`` -> ``tree_verify.TreeLayout``).
Run eagerly that is about 60 kernel launches and their Python every step, and on a small model the
step is bound by that host work (docs/decisions.md, "The tree stage in CUDA graphs").
Without such a buffer the FULL mask (``prefix + W`` columns per row) is built after the stage: an
allocation, a fill and a scatter, then the backend's copy into its buffer.

Batch sizes are padded up to the sizes the target's decode graphs were captured for (as SGLang pads
its own), and every size is captured at the first call, so serving never stalls on a capture.
Same kernels in the graph as eagerly, so the same tree, bit for bit (``tests/adapter/
gpu_stage_check.py`` on a GPU; the padding rows never mix with the real ones: every operation of the
stage is per request). The outputs are views of the graph's static tensors, rewritten by the next
replay, which the next step enqueues on the same stream after this step's readers.

Torch only; capture needs CUDA (``GraphedTreeStage`` runs the eager function elsewhere).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
from dataclasses import fields, replace
from typing import Callable, ContextManager, Optional, Sequence

import torch

from .. import knobs
from ..core.tree import DDTreeBatch
from .tree_verify import TreeLayout

logger = logging.getLogger(__name__)

StageFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], TreeLayout]


def eager_tree_stage() -> bool:
    """``knobs.EAGER_TREE_STAGE``: run the tree stage eagerly every step. For A/B measurements."""
    return knobs.EAGER_TREE_STAGE.get()


#: Attention backends whose verify-mask buffer is known to hold SGLang's unpacked FULL layout, read
#: by the target verify both eagerly (``spec_info.custom_mask``) and from graphs (the buffer). Others
#: (FlashInfer packs bits; hybrid wrappers pick a backend per mode) keep the allocated mask.
FULL_LAYOUT_BACKENDS = ("TritonAttnBackend",)


def backend_mask_buffer(attn_backend) -> Optional[torch.Tensor]:
    """The target attention backend's verify-mask buffer, where the tree stage may write the FULL mask.

    None unless: ``knobs.IN_PLACE_TREE_MASK`` is on (opt-in, docs/decisions.md), the backend is one of
    ``FULL_LAYOUT_BACKENDS``, it has a ``verify_mask`` (SGLang's ``VerifyMask``: allocated with the
    target's CUDA graphs) in FULL_MASK mode that the verify reads, and its buffer is a flat contiguous
    bool/uint8 tensor. SGLang's own EAGLE tree build writes this buffer in place the same way.
    """
    if not knobs.IN_PLACE_TREE_MASK.get():
        return None
    if type(attn_backend).__name__ not in FULL_LAYOUT_BACKENDS:
        return None
    verify_mask = getattr(attn_backend, "verify_mask", None)
    if verify_mask is None or not getattr(verify_mask, "is_read", False):
        return None
    if getattr(getattr(verify_mask, "mode", None), "name", None) != "FULL_MASK":
        return None
    buffer = getattr(verify_mask, "buffer", None)
    if not isinstance(buffer, torch.Tensor) or buffer.dtype not in (torch.bool, torch.uint8):
        return None
    if buffer.dim() != 1 or not buffer.is_contiguous():
        return None
    return buffer


def layout_rows(layout: TreeLayout, bs: int) -> TreeLayout:
    """The first ``bs`` requests of a layout (views; ``mask_index`` is flat, ``W * W`` per request)."""
    tree = DDTreeBatch(**{f.name: getattr(layout.tree, f.name)[:bs] for f in fields(DDTreeBatch)})
    width = layout.tree.num_slots
    return replace(
        layout,
        tree=tree,
        positions=layout.positions[:bs],
        ancestors=layout.ancestors[:bs],
        mask_index=layout.mask_index[: bs * width * width],
        retrieve_index=layout.retrieve_index[:bs],
        retrieve_next_token=layout.retrieve_next_token[:bs],
        retrieve_next_sibling=layout.retrieve_next_sibling[:bs],
    )


class _Captured:
    __slots__ = ("replay", "hidden", "roots", "prefix", "out", "views")

    def __init__(self, replay, hidden, roots, prefix, out):
        self.replay, self.hidden, self.roots, self.prefix, self.out = replay, hidden, roots, prefix, out
        self.views: dict[int, TreeLayout] = {}


class GraphedTreeStage:
    """``stage(hidden, root_tokens, prefix_lens) -> TreeLayout`` replayed from CUDA graphs.

    Args:
        stage: the eager stage, a pure function of its three tensor arguments (no host sync, no
            data-dependent shapes, each request's outputs a function of its own inputs only).
        batch_sizes: the padded batch sizes to capture (the target's decode graph sizes); a batch
            larger than all of them runs eagerly.
        enabled: False runs every call eagerly.

    All sizes are captured at the first call on CUDA tensors (zero inputs; the feature size and
    dtypes of that call), sharing one memory pool: replays never overlap, and every output stays
    referenced here, so no capture reuses another's outputs. If a capture fails it is logged and the
    stage runs eagerly from then on.
    """

    def __init__(
        self,
        stage: StageFn,
        batch_sizes: Sequence[int],
        enabled: bool = True,
        capture_context: Optional[Callable[[], ContextManager]] = None,
    ):
        self.stage = stage
        # Entered once around every capture (SGLang's ``graph_capture``: under tensor parallelism the
        # vocab-parallel head's all-gather then runs through the communicator that graphs can hold, as
        # in SGLang's own decode graphs); its ``stream``, when it has one, is the capture stream.
        self.capture_context = capture_context
        self.batch_sizes = sorted({int(b) for b in batch_sizes if int(b) > 0})
        self.enabled = bool(enabled) and bool(self.batch_sizes)
        self._graphs: dict[int, _Captured] = {}
        self._captured = False
        self._pool = None

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1] if self.batch_sizes else 0

    @property
    def captured_sizes(self) -> list[int]:
        return sorted(self._graphs)

    def __call__(self, hidden: torch.Tensor, root_tokens: torch.Tensor, prefix_lens: torch.Tensor) -> TreeLayout:
        bs = int(hidden.shape[0])
        if not self.enabled or not self._can_capture(hidden) or bs == 0 or bs > self.max_batch:
            return self.stage(hidden, root_tokens, prefix_lens)
        if not self._captured:
            self._capture_all(hidden, root_tokens, prefix_lens)
            if not self.enabled:
                return self.stage(hidden, root_tokens, prefix_lens)
        entry = self._graphs[self.batch_sizes[bisect.bisect_left(self.batch_sizes, bs)]]
        entry.hidden[:bs].copy_(hidden)
        entry.roots[:bs].copy_(root_tokens.reshape(-1))
        entry.prefix[:bs].copy_(prefix_lens)
        entry.replay()
        view = entry.views.get(bs)
        if view is None:
            view = entry.views[bs] = layout_rows(entry.out, bs)
        return view

    # ---- capture (overridden by the CPU tests with a stand-in graph) --------------------------------

    def _can_capture(self, hidden: torch.Tensor) -> bool:
        return hidden.is_cuda

    def _capture_all(self, hidden, root_tokens, prefix_lens) -> None:
        self._captured = True
        tail = tuple(hidden.shape[1:])
        try:
            with self.capture_context() if self.capture_context is not None else contextlib.nullcontext() as ctx:
                stream = getattr(ctx, "stream", None)
                for size in reversed(self.batch_sizes):  # the largest first: the pool's size is set once
                    static = (
                        hidden.new_zeros((size, *tail)),
                        root_tokens.new_zeros((size,)),
                        prefix_lens.new_zeros((size,)),
                    )
                    replay, out = self._capture(static, stream)
                    self._graphs[size] = _Captured(replay, *static, out)
        except Exception:  # noqa: BLE001 (the stage still runs, eagerly)
            logger.exception("DDTREE: could not capture the tree stage in CUDA graphs; it runs eagerly")
            self._graphs.clear()
            self.enabled = False
            return
        logger.info("DDTREE tree stage: captured CUDA graphs for batch sizes %s", self.captured_sizes)

    def _capture(self, static: tuple, stream=None) -> tuple[Callable[[], None], TreeLayout]:
        device = static[0].device
        # Warm up on a side stream (Triton compiles, cuBLAS picks its kernels) outside the capture.
        side = torch.cuda.Stream(device=device) if stream is None else stream
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self.stage(*static)
        torch.cuda.current_stream(device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"):
            out = self.stage(*static)
        return graph.replay, out
