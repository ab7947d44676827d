"""SGLang's FULL tree-verify mask written in place, in one launch (``adapter.tree_verify.full_custom_mask``).

The FULL_MASK layout: per request ``b``, ``W`` rows of ``prefix_b + W`` entries (the prefix all 1,
then the row's ancestor-or-self bits over the ``W`` tree slots), requests back to back. Built with
torch that is an allocation, a fill and a scatter every step, and the attention backend then copies
the result into its CUDA-graph buffer. This kernel writes the layout straight into a given buffer
(the backend's own, so its copy becomes a copy of the buffer onto itself, which torch skips), with a
fixed grid ``(bs, W)`` and no host synchronisation, so it runs inside the tree stage's CUDA graph:
program ``(b, i)`` writes row ``i`` of request ``b``, looping over the row's columns.

Writes past ``out.numel()`` are dropped: the caller uses the buffer only where the whole mask fits
(``full_mask_fits``) and falls back to an allocated mask otherwise.
"""

from __future__ import annotations

import torch

try:  # triton is optional: without it the adapter writes the mask with torch (tree_verify.write_full_mask_torch).
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

__all__ = ["full_mask_available", "write_full_mask", "request_starts"]

#: Columns per inner iteration of a program (one row spans ``prefix + W`` columns).
BLOCK = 1024


def full_mask_available() -> bool:
    return triton is not None


def request_starts(prefix_lens: torch.Tensor, window: int) -> torch.Tensor:
    """``[bs]`` int64: where each request's ``W * (prefix + W)`` entries start (exclusive cumsum, no sync)."""
    sizes = (prefix_lens.to(torch.int64) + int(window)) * int(window)
    return torch.cumsum(sizes, dim=0) - sizes


if triton is not None:

    @triton.jit
    def _full_mask_kernel(
        anc_ptr,  # [bs, W, W] uint8 (bool viewed as bytes): ancestor-or-self bits
        prefix_ptr,  # [bs] int: committed length per request
        start_ptr,  # [bs] int64: request_starts
        out_ptr,  # flat uint8 (a bool buffer viewed as bytes)
        limit,  # out.numel(): writes at or past it are dropped
        W: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        i = tl.program_id(1).to(tl.int64)
        prefix = tl.load(prefix_ptr + b).to(tl.int64)
        row_len = prefix + W
        base = tl.load(start_ptr + b) + i * row_len
        cols = tl.arange(0, BLOCK).to(tl.int64)
        c0 = prefix * 0
        while c0 < row_len:  # (a while loop: Triton's interpreter cannot run a loaded range bound)
            col = c0 + cols
            in_row = col < row_len
            slot = col - prefix
            in_tree = in_row & (slot >= 0)
            bit = tl.load(anc_ptr + (b * W + i) * W + slot, mask=in_tree, other=1)
            value = tl.where(in_tree, bit, 1).to(tl.uint8)
            offs = base + col
            tl.store(out_ptr + offs, value, mask=in_row & (offs < limit))
            c0 += BLOCK


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.bool else t


def write_full_mask(out: torch.Tensor, ancestors: torch.Tensor, prefix_lens: torch.Tensor) -> None:
    """Write the FULL mask of ``ancestors [bs, W, W]`` (bool) into ``out[:size]`` (flat bool or uint8).

    One launch (plus the cumsum of the request starts); no host synchronisation, fixed grid.
    All tensors on one device (CUDA, or CPU under ``TRITON_INTERPRET=1``).
    """
    if triton is None:
        raise RuntimeError("write_full_mask needs triton; use adapter.tree_verify.write_full_mask_torch")
    if out.dtype not in (torch.bool, torch.uint8) or out.dim() != 1 or not out.is_contiguous():
        raise ValueError(
            f"the mask buffer must be a flat contiguous bool/uint8 tensor, got {out.dtype} {tuple(out.shape)}"
        )
    bs, width, _ = (int(d) for d in ancestors.shape)
    if bs == 0:
        return
    starts = request_starts(prefix_lens, width)
    _full_mask_kernel[(bs, width)](
        _bytes(ancestors.contiguous()),
        prefix_lens.contiguous(),
        starts,
        _bytes(out),
        out.numel(),
        W=width,
        BLOCK=BLOCK,
        num_warps=4,
    )
