"""The accepted path's KV moved to the front of each request's verify window, in one launch (Triton).

After a tree verify, node ``k`` of a request's accepted path (verify row ``accept_index[b, k]``) must
have its KV at the window's slot ``k``. SGLang's move (``move_accept_tokens_to_target_kvcache`` ->
``MHATokenToKVPool.move_kv_cache`` -> ``copy_all_layer_kv_cache_tiled``) packs the source and target
slots of every request into two lists of ``bs * W`` entries (zeros after the packed ones) and copies
all of them in every layer, each program walking every entry, though only the nodes that are not at
their slot already move - never the root, nor a path that is a prefix of the window; masking those
entries inside SGLang's grid leaves each program walking every entry (docs/decisions.md, "The
accepted path's KV moved by the overlay"). Here one program per ``(request, layer buffer, byte
tile)`` reads its request's path, returns at once when no node of it moves (the common case at low
acceptance), and otherwise loads
every moving row of its tile before it stores any: a path whose node ``k`` comes from slot ``j``
that node ``j`` overwrites stays correct. Requests own disjoint slots, so programs never overlap.

No host synchronisation: the grid is ``(bs, buffers, tiles)``, the path lengths stay on the device.
"""

from __future__ import annotations

import torch

try:  # triton is optional: without it the caller keeps SGLang's own move.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

__all__ = ["kv_move_available", "move_path_kv", "move_path_kv_torch"]


def kv_move_available() -> bool:
    return triton is not None


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


if triton is not None:

    @triton.jit
    def _move_path_kv_kernel(
        data_ptrs,  # [buffers] int64: each layer's K or V buffer
        strides,  # [buffers] int64: bytes per cache slot of that buffer
        out_cache_loc_ptr,  # [bs * W] cache slots of the verify windows
        accept_index_ptr,  # [bs, W] flat verify rows of each path, -1 after it
        accept_lens_ptr,  # [bs] nodes on each path (root included)
        W,
        W_POW2: tl.constexpr,  # a power of 2 >= the longest path (at most the window)
        BYTES_PER_TILE: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        buf = tl.program_id(1)
        tile = tl.program_id(2)
        k = tl.arange(0, W_POW2)
        n = tl.load(accept_lens_ptr + b)
        on_path = (k < n) & (k < W)
        rows = tl.load(accept_index_ptr + b * W + k, mask=on_path, other=0).to(tl.int64)
        on_path = on_path & (rows >= 0)
        src = tl.load(out_cache_loc_ptr + rows, mask=on_path, other=0).to(tl.int64)
        tgt = tl.load(out_cache_loc_ptr + b * W + k, mask=on_path, other=0).to(tl.int64)
        moves = on_path & (src != tgt)
        if tl.max(moves.to(tl.int32), axis=0) == 0:
            return
        stride = tl.load(strides + buf)
        base = tl.cast(tl.load(data_ptrs + buf), tl.pointer_type(tl.uint8))
        byte_off = tile * BYTES_PER_TILE + tl.arange(0, BYTES_PER_TILE)
        mask = moves[:, None] & (byte_off < stride)[None, :]
        vals = tl.load(base + src[:, None] * stride + byte_off[None, :], mask=mask)
        tl.store(base + tgt[:, None] * stride + byte_off[None, :], vals, mask=mask)


def move_path_kv(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_index: torch.Tensor,
    accept_lens: torch.Tensor,
    config: dict,
    max_path: int = 0,
) -> None:
    """Move each request's accepted path to its window's front slots in every buffer.

    ``data_ptrs``/``strides``: the pool's (one entry per layer's K or V buffer, strides in bytes);
    ``out_cache_loc``: ``[bs * W]`` window slots; ``accept_index``: ``[bs, W]`` verify rows of each
    path (-1 after it); ``accept_lens``: ``[bs]``; ``config``: the pool's ``_kv_copy_config``
    (``bytes_per_tile``, ``byte_tiles``, ``num_warps``); ``max_path``: the longest path a step can
    accept (the drafter's block: the root and one node per draft position), 0 for the window. A program
    holds ``max_path`` rows of its byte tile, not the window's: a wide tree's window stays out of its
    registers.
    """
    bs, window = (int(d) for d in accept_index.shape)
    if bs == 0:
        return
    rows = min(window, int(max_path)) if max_path and int(max_path) > 0 else window
    grid = (bs, int(data_ptrs.numel()), int(config["byte_tiles"]))
    _move_path_kv_kernel[grid](
        data_ptrs,
        strides,
        out_cache_loc,
        accept_index,
        accept_lens,
        window,
        W_POW2=_next_power_of_2(rows),
        BYTES_PER_TILE=int(config["bytes_per_tile"]),
        num_warps=int(config.get("num_warps", 4)),
    )


def move_path_kv_torch(
    buffers: list, out_cache_loc: torch.Tensor, accept_index: torch.Tensor, accept_lens: torch.Tensor
) -> None:
    """The reference (SGLang's semantics): per request, rows read before any is written."""
    bs, window = accept_index.shape
    for b in range(bs):
        n = int(accept_lens[b])
        src = out_cache_loc[accept_index[b, :n].long()]
        tgt = out_cache_loc[b * window : b * window + n]
        for buf in buffers:
            buf[tgt] = buf[src].clone()
