"""The accepted path of a tree verify in one launch (``adapter.tree_verify.accepted_step``'s body).

After SGLang's tree acceptance (``eagle_sample``) the step turns ``predict`` / ``accept_index`` /
``accept_lens`` into the tokens emitted, the next root (bonus), the verify rows to commit and their
KV positions. As torch ops that is about 25 small launches and their Python every decode step, which
matters on a small model, where the step is bound by host work (docs/decisions.md, "The accepted
path in one launch"). This kernel does it in one: program ``b`` handles request ``b``'s row of ``W``
slots.

Inputs as ``eagle_sample`` returns them: ``accept_index[b, j]`` (``j < accept_lens[b]``) are valid
flat verify rows; the rest may be -1. Same outputs as the torch code for such inputs (the kernel
test compares them); a row that is still -1 where it is used reads token 0 instead of wrapping.
"""

from __future__ import annotations

import torch

try:  # triton is optional: without it the torch code runs (adapter.tree_verify.accepted_step).
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

__all__ = ["accept_path_available", "accept_path"]


def accept_path_available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _accept_path_kernel(
        predict_ptr,  # [bs * W] int32/int64: the target's token after every verify row
        accept_index_ptr,  # [bs, W] int32/int64: flat rows of the root and accepted nodes, then -1
        accept_lens_ptr,  # [bs] tokens emitted (accepted drafts + the bonus)
        prefix_ptr,  # [bs] committed length before the step
        out_tokens_ptr,  # [bs, W] int64
        path_rows_ptr,  # [bs, W] int64
        path_positions_ptr,  # [bs, W] int64
        bonus_ptr,  # [bs] int64
        lens_ptr,  # [bs] int32
        W: tl.constexpr,
        W_P2: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        j = tl.arange(0, W_P2)
        inside = j < W
        n = tl.load(accept_lens_ptr + b).to(tl.int64)
        idx = tl.load(accept_index_ptr + b * W + j, mask=inside, other=-1).to(tl.int64)
        end = tl.maximum(n - 1, 0)
        at_end = j == end
        last = tl.sum(tl.where(at_end, idx, 0), axis=0)  # the row of the last emitted token
        valid = inside & (j < n)
        rows = tl.where(valid & (idx >= 0), idx, last)
        tokens = tl.load(predict_ptr + rows, mask=inside & (rows >= 0), other=0).to(tl.int64)
        tokens = tl.where(valid, tokens, 0)
        bonus = tl.sum(tl.where(at_end, tokens, 0), axis=0)
        prefix = tl.load(prefix_ptr + b).to(tl.int64)
        tl.store(out_tokens_ptr + b * W + j, tokens, mask=inside)
        tl.store(path_rows_ptr + b * W + j, rows, mask=inside)
        tl.store(path_positions_ptr + b * W + j, prefix + j, mask=inside)
        tl.store(bonus_ptr + b, bonus)
        tl.store(lens_ptr + b, n.to(tl.int32))


def accept_path(
    predict: torch.Tensor, accept_index: torch.Tensor, accept_lens: torch.Tensor, prefix_lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out_tokens, accept_lens int32, bonus, path_rows, path_positions)`` of ``AcceptedStep``, one launch.

    All tensors on one device (CUDA, or CPU under ``TRITON_INTERPRET=1``); shapes as
    ``adapter.tree_verify.accepted_step`` documents.
    """
    if triton is None:
        raise RuntimeError("accept_path needs triton; use adapter.tree_verify.accepted_step")
    bs, width = (int(d) for d in accept_index.shape)
    device = accept_index.device
    out_tokens = torch.empty((bs, width), dtype=torch.int64, device=device)
    path_rows = torch.empty((bs, width), dtype=torch.int64, device=device)
    path_positions = torch.empty((bs, width), dtype=torch.int64, device=device)
    bonus = torch.empty((bs,), dtype=torch.int64, device=device)
    lens = torch.empty((bs,), dtype=torch.int32, device=device)
    if bs:
        _accept_path_kernel[(bs,)](
            predict.contiguous(),
            accept_index.contiguous(),
            accept_lens.contiguous(),
            prefix_lens.contiguous(),
            out_tokens,
            path_rows,
            path_positions,
            bonus,
            lens,
            W=width,
            W_P2=triton.next_power_of_2(width),
            num_warps=1,
        )
    return out_tokens, lens, bonus, path_rows, path_positions
