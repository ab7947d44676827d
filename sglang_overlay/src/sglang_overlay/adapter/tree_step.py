"""One DDTree decode step, written against small "ports" so it runs with or without SGLang.

The worker (``worker.py``) implements the ports with SGLang 0.5.23's DFlash machinery on a GPU;
the tests implement them with toy models on CPU and SGLang's own Triton verify kernel, which is
how the step's control flow is exercised here (a real GPU server could not be run).

Order of one step (``bs`` requests, drafter block ``L + 1``, verify window ``W``: the tree's
``budget + 1`` slots, at least the block for one budget; ``W`` may exceed the block, the tree's
depth never does):

1. ``draft_hidden``: DFlash's draft forward over ``[root, MASK x L]`` -> hidden ``[bs, L + 1, H]``.
2. ``head_topk``: rows 1..L through the target LM head -> per-position top-k log-probs; with a
   DFlash2 drafter instead its candidate selector's lattice (``lattice_tree_stage``).
3. core: best-first tree per request under the budget, padded to ``W`` slots; SGLang's FULL
   custom mask, positions ``prefix + depth`` and EAGLE verify links (``tree_verify``).
   Steps 2-3 are the *tree stage* (``stage``): fixed shapes, no host sync; the worker replays it
   from a CUDA graph per batch size (``tree_stage.GraphedTreeStage``). The FULL mask is written by
   the stage into the attention backend's verify-mask buffer where the worker has one
   (``mask_out``), else built after the stage (its size is per-step data).
4. ``verify``: the target's TARGET_VERIFY forward over the tree (eager, tree mask) ->
   logits per row and the target hidden states DFlash's drafter conditions on.
5. ``accept``: SGLang's tree acceptance (``eagle_sample``: greedy or target-only sampling).
6. ``commit``: move the accepted rows' target KV to the front of the window and write the
   drafter's KV for the committed tokens from the target hidden states of the accepted path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Protocol

import torch

from ..core.lattice import build_lattice_tree_batched
from ..kernels.full_mask import full_mask_available, write_full_mask
from .settings import ResolvedDDTree
from .tree_verify import (
    AcceptedStep,
    TreeLayout,
    TreeVerifyTensors,
    accepted_step,
    check_window,
    layout_of_tree,
    tree_layout,
    verify_tensors_from_layout,
    write_full_mask_torch,
)


class TreeStepPorts(Protocol):
    def draft_hidden(self, root_tokens: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
        """``[bs, L + 1, H]`` the drafter's hidden states over its block ``[root, MASK, ...]``."""

    def head_topk(self, hidden_rows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[N, H]`` -> ``([N, k]`` float32 log-probs descending, ``[N, k]`` int64 ids)."""

    def verify(self, tensors: TreeVerifyTensors) -> Any:
        """Run the target over the tree; the result is handed to ``accept`` and ``commit``."""

    def accept(self, tensors: TreeVerifyTensors, verified: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(predict [bs*W], accept_lens [bs] incl. bonus, accept_index [bs, W])``."""

    def commit(self, tensors: TreeVerifyTensors, verified: Any, step: AcceptedStep) -> None:
        """Make the KV caches (target and drafter) hold exactly the committed path."""


@dataclass(frozen=True)
class TreeStepResult:
    tensors: TreeVerifyTensors
    verified: Any
    step: AcceptedStep


def draft_topk_from_hidden(
    head_topk: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]], hidden: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position top-k of the drafter's block rows 1..L: ``[bs, L, k]`` each."""
    bs, width, size = (int(d) for d in hidden.shape)
    rows = hidden[:, 1:, :].reshape(bs * (width - 1), size)
    log_probs, token_ids = head_topk(rows, k)
    k_out = int(log_probs.shape[-1])
    return log_probs.view(bs, width - 1, k_out), token_ids.view(bs, width - 1, k_out)


def tree_stage(
    head_topk: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]],
    settings: ResolvedDDTree,
    builder: Optional[Callable[..., Any]] = None,
    mask_out: Optional[torch.Tensor] = None,
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], TreeLayout]:
    """Steps 2-3 as one function ``(hidden [bs, W, H], root_tokens [bs], prefix_lens [bs]) -> TreeLayout``.

    Fixed shapes and no host sync when ``head_topk`` and ``builder`` have none (the worker's dense
    head and the tree kernel), so it can be captured in a CUDA graph.

    ``mask_out`` (flat bool/uint8, e.g. the attention backend's verify-mask buffer): the stage also
    writes the whole FULL mask there (``kernels.full_mask``: one launch on CUDA, fixed grid, no sync;
    entries past the buffer are dropped) and the layout says so (``mask_buffer``); the verify input
    is then a view of it, with no per-step allocation, fill, scatter or copy.
    """

    def stage(hidden: torch.Tensor, root_tokens: torch.Tensor, prefix_lens: torch.Tensor) -> TreeLayout:
        # hidden: [bs, L + 1, H] over the drafter's block; the layout is padded to settings.window.
        log_probs, token_ids = draft_topk_from_hidden(head_topk, hidden, settings.effective_top_k)
        layout = tree_layout(
            log_probs,
            token_ids,
            root_tokens=root_tokens,
            prefix_lens=prefix_lens,
            budget=settings.budget,
            top_k=settings.effective_top_k,
            window=settings.window,
            builder=builder,
        )
        return _with_full_mask(layout, prefix_lens, mask_out)

    return stage


def lattice_tree_stage(
    lattice: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    settings: ResolvedDDTree,
    mask_out: Optional[torch.Tensor] = None,
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], TreeLayout]:
    """Steps 2-3 for a DFlash2 drafter: the tree grown best-first over its candidate selector's lattice.

    ``lattice(hidden_rows [bs, L, H], root_tokens [bs]) -> (candidate_ids [bs, L, K], scores [bs, L, K, K])``
    is the drafter's own selector (SGLang's ``compute_candidates`` + ``build_lattice``; slot 0's row
    ``p = 0`` conditions on the root). The tree is ``core.lattice.build_lattice_tree_batched``'s (a node
    scores its parent's score plus the transition's conditional log-prob), at most ``min(top_k, K)``
    children a node; everything after the tree (layout, mask, verify, accept, commit) is the marginal
    tree's. Same contract as ``tree_stage``: fixed shapes, no host sync when ``lattice`` has none.
    """
    check_window(settings.budget, settings.window)

    def stage(hidden: torch.Tensor, root_tokens: torch.Tensor, prefix_lens: torch.Tensor) -> TreeLayout:
        candidate_ids, scores = lattice(hidden[:, 1:, :], root_tokens)
        width = int(candidate_ids.shape[-1])
        tree = build_lattice_tree_batched(
            candidate_ids,
            scores,
            settings.budget,
            top_k_cap=min(settings.effective_top_k, width),
            root_tokens=root_tokens,
        )
        return _with_full_mask(layout_of_tree(tree, prefix_lens, settings.window), prefix_lens, mask_out)

    return stage


def _with_full_mask(layout: TreeLayout, prefix_lens: torch.Tensor, mask_out: Optional[torch.Tensor]) -> TreeLayout:
    """The layout, with its FULL mask written into ``mask_out`` where the stage has one."""
    if mask_out is None:
        return layout
    if mask_out.is_cuda and full_mask_available():
        write_full_mask(mask_out, layout.ancestors, prefix_lens)
    else:
        write_full_mask_torch(mask_out, layout.ancestors, prefix_lens)
    return replace(layout, mask_buffer=mask_out)


def run_tree_step(
    ports: TreeStepPorts,
    settings: ResolvedDDTree,
    root_tokens: torch.Tensor,
    prefix_lens: torch.Tensor,
    prefix_lens_cpu: Optional[torch.Tensor] = None,
    builder: Optional[Callable[..., Any]] = None,
    stage: Optional[Callable[[torch.Tensor, torch.Tensor, torch.Tensor], TreeLayout]] = None,
    mask_size_bound: Optional[int] = None,
) -> TreeStepResult:
    """One DDTree decode step for a batch (see the module docstring).

    ``builder`` replaces the core's batched tree builder (same signature and output); ``stage``
    replaces steps 2-3 as a whole (default: ``tree_stage(ports.head_topk, settings, builder)``).
    ``mask_size_bound`` (``tree_verify.full_mask_size_bound``) sizes the FULL mask without a host
    sync when ``prefix_lens_cpu`` is not known.
    """
    hidden = ports.draft_hidden(root_tokens, prefix_lens)
    if int(hidden.shape[1]) != settings.block:
        raise RuntimeError(
            f"DDTREE: drafter returned {int(hidden.shape[1])} rows per request, expected its block of {settings.block}"
        )
    if stage is None:
        stage = tree_stage(ports.head_topk, settings, builder)
    layout = stage(hidden, root_tokens, prefix_lens)
    tensors = verify_tensors_from_layout(layout, prefix_lens, prefix_lens_cpu, mask_size_bound)
    verified = ports.verify(tensors)
    predict, accept_lens, accept_index = ports.accept(tensors, verified)
    step = accepted_step(predict, accept_index, accept_lens, prefix_lens)
    ports.commit(tensors, verified, step)
    return TreeStepResult(tensors=tensors, verified=verified, step=step)
