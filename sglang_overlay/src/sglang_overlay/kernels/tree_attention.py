"""The target's tree-verify attention, grouped by KV head (Triton), for SGLang's Triton backend.

Why: SGLang 0.5.23's Triton extend kernel (``extend_attention._fwd_kernel``) runs a verify of ``W``
query rows per request with the prefill tile ``BLOCK_M = 128`` rows, 8 warps on Hopper (head dim
128): one program per (request, query head), ``W = 16`` of its 128 rows real, and every program of
a KV head's ``G`` query heads reads the same prefix K/V again. The kernel sits at the 255-register
limit and spills; with a custom mask the extend tile also loads the ``[128, 64]`` mask tile,
reduces it for its skip test and branches on it, and spills more (docs/decisions.md, "The tree
verify's attention in its own kernel", has the numbers).

This kernel computes the same attention (prefix columns all visible, the window's columns where
the FULL mask says so) with one program per (request, group of ``HEADS`` query heads of one KV
head): its tile holds ``HEADS x W`` rows (``4 x 16 = 64`` for Qwen3-8B), so each prefix K/V tile
is loaded once per KV head, no row is padding, and the softmax is SGLang's (the same online
update, tile order and scales), so the result can differ from SGLang's kernel only by the rounding
of the ``tl.dot`` tiles (``benchmarks/tree_attention.py`` compares the two bit for bit on a GPU).

``extend_fn(original)`` wraps SGLang's ``extend_attention_fwd`` (the backend's
``extend_attention_fwd`` attribute): calls this kernel can serve (a custom mask in SGLang's FULL
layout read from the window only, page size 1, no sliding window, sinks, soft cap, score mod, LSE
or fp8 cache, ``W <= MAX_WINDOW``) run here; every other call runs the original unchanged. A window longer
than a tile's rows (``max_rows``) is split into row blocks, one program each (the third grid axis).
"""

from __future__ import annotations

import os
from typing import Callable, Mapping, Optional

import torch

try:  # triton is optional: without it nothing is wrapped.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

from .. import knobs

__all__ = [
    "MAX_WINDOW",
    "TILES",
    "TreeAttentionConfig",
    "config_from_env",
    "device_capability",
    "extend_fn",
    "tree_attention_available",
    "tree_verify_attention",
    "tile_for",
    "tree_verify_attention_torch",
]

# Switched by ``knobs.TREE_ATTENTION`` (read by ``adapter.hooks.install_tree_attention``); the tile by
# ``knobs.TREE_ATTENTION_CONFIG`` (``config_from_env``), else the GPU's row of ``TILES``.

#: Longest verify window served (query rows per request): the widest tree (``adapter.settings.MAX_BUDGET``
#: nodes and the root). Longer ones run SGLang's kernel.
MAX_WINDOW = 512


class TreeAttentionConfig(tuple):
    """``(max_rows, block_n, num_warps)``: rows per program at most (query heads x window)."""

    __slots__ = ()

    def __new__(cls, max_rows: int = 64, block_n: int = 64, num_warps: int = 8):
        return super().__new__(cls, (int(max_rows), int(block_n), int(num_warps)))

    max_rows = property(lambda self: self[0])
    block_n = property(lambda self: self[1])
    num_warps = property(lambda self: self[2])


#: The tile per GPU, by compute capability in Triton's form (major x 10 + minor), when
#: ``knobs.TREE_ATTENTION_CONFIG`` is unset. The rule: on a GPU ``benchmarks/tree_attention.py`` has measured,
#: the fastest tile it compares that equals SGLang's masked output bit for bit; on the others, the widest tile
#: ptxas compiles for that GPU without spilling registers (``scripts/check_kernels.py`` compiles each GPU's tile
#: and fails one that spills). The 64-row tile fits Hopper's registers (its MMA accumulates in its own
#: registers); with the MMA of other GPUs it spills, so they take 32 rows (two heads of a 16-row window per
#: program instead of four). docs/kernels.md has the compiles behind the rows.
TILES = {
    86: TreeAttentionConfig(32, 64, 8),
    90: TreeAttentionConfig(64, 64, 8),
    120: TreeAttentionConfig(32, 64, 8),
}
#: A GPU without a row: the tile that spills on none of the rows'.
FALLBACK_TILE = TreeAttentionConfig(32, 64, 8)


def tile_for(capability: Optional[int]) -> TreeAttentionConfig:
    """The tile of a GPU of ``capability`` (``None``: unknown, e.g. no GPU): its row of ``TILES``, else
    ``FALLBACK_TILE``."""
    return TILES.get(capability, FALLBACK_TILE)


def device_capability(device: Optional[torch.device] = None) -> Optional[int]:
    """The compute capability of ``device`` (default: the current CUDA device), ``None`` without CUDA."""
    if device is not None and device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def tree_attention_available() -> bool:
    return triton is not None


def config_from_env(
    environ: Optional[Mapping[str, str]] = None, capability: Optional[int] = None
) -> TreeAttentionConfig:
    """The tile from ``knobs.TREE_ATTENTION_CONFIG`` (``ROWS,BLOCK_N,WARPS``), else ``tile_for(capability)``."""
    knob = knobs.TREE_ATTENTION_CONFIG
    raw = knob.get(environ)
    if not raw:
        return tile_for(capability)
    parts = [int(p) for p in raw.split(",")]
    if len(parts) != 3 or any(p < 1 for p in parts):
        raise ValueError(f"{knob.name} must be ROWS,BLOCK_N,WARPS (positive integers), got {raw!r}")
    return TreeAttentionConfig(*parts)


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def launch_shape(num_q_heads: int, num_kv_heads: int, window: int, max_rows: int) -> tuple[int, int]:
    """``(heads per program, rows per head)``: heads divide the KV group, rows a power of 2.

    Heads per program: the largest power of 2 dividing the group with ``heads x rows <= max_rows``
    (at least 1). Rows per head: ``window`` rounded up to a power of 2 but at most ``max_rows`` (a
    longer window takes ``row_blocks`` programs per head group), and at least ``16 / heads`` so a tile
    has the 16 rows ``tl.dot`` needs.
    """
    group = int(num_q_heads) // int(num_kv_heads)
    rows = min(_pow2(max(1, int(window))), max(1, _pow2(int(max_rows) + 1) // 2))
    heads = 1
    while group % (heads * 2) == 0 and heads * 2 * rows <= int(max_rows):
        heads *= 2
    rows = max(rows, 16 // heads)
    return heads, rows


def row_blocks(window: int, rows: int) -> int:
    """Programs per (request, head group): the window's rows in blocks of ``rows``."""
    return max(1, -(-int(window) // int(rows)))


if triton is not None:

    @triton.jit
    def _tree_verify_attn_kernel(
        Q,  # [tokens, q_heads, Lq]
        K_Ext,  # [tokens, kv_heads, Lq]: the window's own K (also written to the cache)
        V_Ext,
        O,  # noqa: E741 - SGLang's extend kernel's name. [tokens, q_heads, Lv]
        K_Buf,  # the layer's KV cache
        V_Buf,
        qo_indptr,  # [bs + 1]
        kv_indptr,  # [bs + 1]: the prefix of each request in kv_indices
        kv_indices,
        mask_ptr,  # flat uint8, SGLang's FULL layout
        mask_indptr,  # [bs + 1]
        sm_scale,
        k_scale,
        v_scale,
        stride_qbs,
        stride_qh,
        stride_kbs,
        stride_kh,
        stride_vbs,
        stride_vh,
        stride_obs,
        stride_oh,
        stride_buf_kbs,
        stride_buf_kh,
        stride_buf_vbs,
        stride_buf_vh,
        GROUP: tl.constexpr,  # query heads per KV head
        HEADS: tl.constexpr,  # query heads per program (divides GROUP)
        ROWS: tl.constexpr,  # rows per head and program (power of 2; the window in row blocks of it)
        Lq: tl.constexpr,
        Lv: tl.constexpr,
        BLOCK_DMODEL: tl.constexpr,
        BLOCK_DV: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        cur_seq = tl.program_id(0)
        head0 = tl.program_id(1) * HEADS
        row0 = tl.program_id(2) * ROWS
        kv_head = head0 // GROUP

        q_start = tl.load(qo_indptr + cur_seq)
        q_len = tl.load(qo_indptr + cur_seq + 1) - q_start
        kv_start = tl.load(kv_indptr + cur_seq)
        prefix = tl.load(kv_indptr + cur_seq + 1) - kv_start
        seq_len = prefix + q_len
        mask_start = tl.load(mask_indptr + cur_seq)

        offs_r = tl.arange(0, HEADS * ROWS)
        head = head0 + offs_r // ROWS
        row = row0 + offs_r % ROWS
        mask_m = row < q_len
        offs_d = tl.arange(0, BLOCK_DMODEL)
        offs_dv = tl.arange(0, BLOCK_DV)
        mask_d = offs_d < Lq
        mask_dv = offs_dv < Lv
        offs_n = tl.arange(0, BLOCK_N)

        q = tl.load(
            Q + (q_start + row[:, None]) * stride_qbs + head[:, None] * stride_qh + offs_d[None, :],
            mask=mask_m[:, None] & mask_d[None, :],
            other=0.0,
        )
        acc = tl.zeros([HEADS * ROWS, BLOCK_DV], dtype=tl.float32)
        deno = tl.zeros([HEADS * ROWS], dtype=tl.float32)
        e_max = tl.zeros([HEADS * ROWS], dtype=tl.float32) - float("inf")

        # The prefix: every column visible (SGLang's FULL mask is all ones there and its kernel
        # skips it: skip_prefix_custom_mask).
        # (while loops: Triton's interpreter cannot run a range over a loaded bound)
        start_n = prefix * 0
        while start_n < prefix:
            mask_n = (start_n + offs_n) < prefix
            final_mask = mask_m[:, None] & mask_n[None, :]
            loc = tl.load(kv_indices + kv_start + start_n + offs_n, mask=mask_n, other=0)
            k = tl.load(
                K_Buf + loc[None, :] * stride_buf_kbs + kv_head * stride_buf_kh + offs_d[:, None],
                mask=mask_n[None, :] & mask_d[:, None],
                other=0.0,
            )
            qk = tl.dot(q.to(k.dtype), k)
            qk *= sm_scale * k_scale
            qk = tl.where(final_mask, qk, float("-inf"))
            row_max = tl.max(qk, 1)
            row_max_fixed = tl.where(row_max == float("-inf"), -1e20, row_max)
            n_e_max = tl.maximum(row_max_fixed, e_max)
            re_scale = tl.exp(e_max - n_e_max)
            p = tl.exp(qk - n_e_max[:, None])
            deno = deno * re_scale + tl.sum(p, 1)
            v = tl.load(
                V_Buf + loc[:, None] * stride_buf_vbs + kv_head * stride_buf_vh + offs_dv[None, :],
                mask=mask_n[:, None] & mask_dv[None, :],
                other=0.0,
            )
            acc = acc * re_scale[:, None] + tl.dot(p.to(v.dtype), v) * v_scale
            e_max = n_e_max
            start_n += BLOCK_N

        # The window: its own K/V, where the FULL mask (row's ancestors and itself) says so.
        start_n = q_len * 0
        while start_n < q_len:
            mask_n = (start_n + offs_n) < q_len
            in_tile = mask_m[:, None] & mask_n[None, :]
            bits = tl.load(
                mask_ptr + mask_start + row[:, None] * seq_len + prefix + start_n + offs_n[None, :],
                mask=in_tile,
                other=0,
            )
            final_mask = in_tile & (bits != 0)
            k = tl.load(
                K_Ext + (q_start + start_n + offs_n[None, :]) * stride_kbs + kv_head * stride_kh + offs_d[:, None],
                mask=mask_n[None, :] & mask_d[:, None],
                other=0.0,
            )
            qk = tl.dot(q, k, out_dtype=tl.float32)
            qk *= sm_scale
            qk = tl.where(final_mask, qk, float("-inf"))
            row_max = tl.max(qk, 1)
            row_max_fixed = tl.where(row_max == float("-inf"), -1e20, row_max)
            n_e_max = tl.maximum(row_max_fixed, e_max)
            re_scale = tl.exp(e_max - n_e_max)
            p = tl.exp(qk - n_e_max[:, None])
            deno = deno * re_scale + tl.sum(p, 1)
            v = tl.load(
                V_Ext + (q_start + start_n + offs_n[:, None]) * stride_vbs + kv_head * stride_vh + offs_dv[None, :],
                mask=mask_n[:, None] & mask_dv[None, :],
                other=0.0,
            )
            acc = acc * re_scale[:, None] + tl.dot(p.to(v.dtype), v)
            e_max = n_e_max
            start_n += BLOCK_N

        deno_safe = tl.where(deno == 0.0, 1.0, deno)
        tl.store(
            O + (q_start + row[:, None]) * stride_obs + head[:, None] * stride_oh + offs_dv[None, :],
            (acc / deno_safe[:, None]).to(O.dtype.element_ty),
            mask=mask_m[:, None] & mask_dv[None, :],
        )


def tree_verify_attention(
    q: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    o: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor,
    mask_indptr: torch.Tensor,
    max_len_extend: int,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    sm_scale: Optional[float] = None,
    config: Optional[TreeAttentionConfig] = None,
) -> None:
    """Write the tree-verify attention of every request into ``o`` (SGLang's extend layout).

    Tensors as SGLang's ``extend_attention_fwd`` takes them: ``q`` ``[tokens, q_heads, Lq]``,
    ``k_extend``/``v_extend`` ``[tokens, kv_heads, L]``, ``o`` ``[tokens, q_heads, Lv]``, the layer's
    cache buffers ``[slots, kv_heads, L]``, ``qo_indptr``/``kv_indptr``/``mask_indptr`` ``[bs + 1]``,
    ``kv_indices`` the prefix slots, ``custom_mask`` the flat FULL mask (bool or uint8). One launch,
    grid ``(bs, q_heads / heads per program, row blocks)``; no host synchronisation (CUDA-graph safe). ``config``:
    the tile, default the GPU's (``tile_for``).
    """
    if triton is None:
        raise RuntimeError("tree_verify_attention needs triton")
    bs = int(qo_indptr.shape[0]) - 1
    q_heads, kv_heads = int(q.shape[1]), int(k_extend.shape[1])
    lq, lv = int(q.shape[-1]), int(v_extend.shape[-1])
    if bs <= 0:
        return
    config = config or tile_for(device_capability(q.device))
    heads, rows = launch_shape(q_heads, kv_heads, max_len_extend, config.max_rows)
    mask = custom_mask.view(torch.uint8) if custom_mask.dtype == torch.bool else custom_mask
    _tree_verify_attn_kernel[(bs, q_heads // heads, row_blocks(max_len_extend, rows))](
        q,
        k_extend,
        v_extend,
        o,
        k_buffer,
        v_buffer,
        qo_indptr,
        kv_indptr,
        kv_indices,
        mask,
        mask_indptr,
        float(sm_scale if sm_scale is not None else 1.0 / (lq**0.5)),
        float(k_scale),
        float(v_scale),
        q.stride(0),
        q.stride(1),
        k_extend.stride(0),
        k_extend.stride(1),
        v_extend.stride(0),
        v_extend.stride(1),
        o.stride(0),
        o.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        GROUP=q_heads // kv_heads,
        HEADS=heads,
        ROWS=rows,
        Lq=lq,
        Lv=lv,
        BLOCK_DMODEL=_pow2(lq),
        BLOCK_DV=_pow2(lv),
        BLOCK_N=config.block_n,
        num_warps=config.num_warps,
        num_stages=1,
    )


def tree_verify_attention_torch(
    q,
    k_extend,
    v_extend,
    k_buffer,
    v_buffer,
    qo_indptr,
    kv_indptr,
    kv_indices,
    custom_mask,
    mask_indptr,
    sm_scale: Optional[float] = None,
) -> torch.Tensor:
    """Reference in float32 torch (host loop; tests only): the attention ``tree_verify_attention`` computes."""
    tokens, q_heads, lq = (int(d) for d in q.shape)
    kv_heads = int(k_extend.shape[1])
    group = q_heads // kv_heads
    scale = sm_scale if sm_scale is not None else 1.0 / (lq**0.5)
    out = torch.zeros((tokens, q_heads, int(v_extend.shape[-1])), dtype=torch.float32)
    mask = custom_mask.to(torch.bool)
    for b in range(int(qo_indptr.shape[0]) - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        p0, p1 = int(kv_indptr[b]), int(kv_indptr[b + 1])
        locs = kv_indices[p0:p1].long()
        n, prefix = q1 - q0, p1 - p0
        keys = torch.cat([k_buffer[locs], k_extend[q0:q1]]).float()  # [prefix + n, kv_heads, L]
        vals = torch.cat([v_buffer[locs], v_extend[q0:q1]]).float()
        m0 = int(mask_indptr[b])
        visible = mask[m0 : m0 + n * (prefix + n)].reshape(n, prefix + n)
        for h in range(q_heads):
            s = q[q0:q1, h].float() @ keys[:, h // group].T * scale
            s = s.masked_fill(~visible, float("-inf"))
            out[q0:q1, h] = torch.softmax(s, dim=-1) @ vals[:, h // group]
    return out


def _eligible(q, k_extend, k_buffer, custom_mask, is_causal, max_len_extend, page_size, extra) -> bool:
    if custom_mask is None or k_extend is None or (not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1"):
        return False
    if custom_mask.dtype not in (torch.bool, torch.uint8) or not custom_mask.is_contiguous():
        return False
    if int(max_len_extend) > MAX_WINDOW or int(page_size) != 1:
        return False
    if k_buffer.dtype != q.dtype or q.dtype not in (torch.bfloat16, torch.float16):
        return False
    if int(q.shape[1]) % int(k_extend.shape[1]) != 0 or int(q.shape[-1]) > 256:
        return False
    if k_buffer.dim() != 3:
        return False
    return (
        extra.get("skip_prefix_custom_mask", True)
        and extra.get("sliding_window_size", -1) in (None, -1, 0)
        and extra.get("sinks") is None
        and extra.get("window_kv_offsets") is None
        and (extra.get("xai_temperature_len", -1) or -1) <= 0
        and extra.get("lse_extend") is None
        and not extra.get("skip_prefix", False)
        and not extra.get("skip_extend", False)
        and extra.get("score_mod") is None
        and extra.get("aux_tensors") is None
        and float(extra.get("logit_cap", 0.0) or 0.0) <= 0.0
        and not extra.get("identity_kv_indices", False)
    )


#: Attribute set on a wrapped function, so a backend is never wrapped twice.
WRAPPED = "_ddtree_tree_attention"


def extend_fn(original: Callable, config: Optional[TreeAttentionConfig] = None) -> Callable:
    """Wrap SGLang's ``extend_attention_fwd``: the tree verify runs ``tree_verify_attention``.

    Positional arguments as the Triton backend passes them (``q, k, v, o, k_buffer, v_buffer,
    qo_indptr, kv_indptr, kv_indices, custom_mask, is_causal, mask_indptr, max_len_extend, k_scale,
    v_scale[, sm_scale]``) and its keywords. A call without a custom mask (prefill, DFLASH's
    causal verify) or with anything this kernel does not serve goes to ``original`` unchanged.
    """
    if getattr(original, WRAPPED, False):
        return original
    cfg = config or config_from_env(capability=device_capability())

    def extend_attention_fwd(
        q,
        k,
        v,
        o,
        k_buffer,
        v_buffer,
        qo_indptr,
        kv_indptr,
        kv_indices,
        custom_mask,
        is_causal,
        mask_indptr,
        max_len_extend,
        k_scale=1.0,
        v_scale=1.0,
        sm_scale=None,
        *args,
        **kwargs,
    ):
        if args or not _eligible(
            q, k, k_buffer, custom_mask, is_causal, max_len_extend, kwargs.get("page_size", 1), kwargs
        ):
            return original(
                q,
                k,
                v,
                o,
                k_buffer,
                v_buffer,
                qo_indptr,
                kv_indptr,
                kv_indices,
                custom_mask,
                is_causal,
                mask_indptr,
                max_len_extend,
                k_scale,
                v_scale,
                sm_scale,
                *args,
                **kwargs,
            )
        tree_verify_attention(
            q,
            k,
            v,
            o,
            k_buffer,
            v_buffer,
            qo_indptr,
            kv_indptr,
            kv_indices,
            custom_mask,
            mask_indptr,
            int(max_len_extend),
            k_scale,
            v_scale,
            sm_scale,
            cfg,
        )
        return None

    setattr(extend_attention_fwd, WRAPPED, True)
    extend_attention_fwd.__wrapped__ = original
    return extend_attention_fwd
