"""Fused draft top-k: per-row top-k log-probs of ``[N, V]`` logits from one pass over the logits.

``fused_draft_topk(logits, k)`` returns what ``core.tree.draft_topk(logits, k, stable=True)``
returns -- ``[N, k]`` float32 log-probs sorted descending and their int64 token ids, equal
log-probs ordered by the smaller token id -- without materializing ``[N, V]`` float32 copies
(``draft_topk`` makes three: the float32 cast, ``log_softmax`` and the sort's values; their cost is
in docs/decisions.md, "The fused draft top-k").

Two launches, no host synchronisation (shapes only), so it can sit inside a CUDA graph:

1. ``_chunk_topk_kernel``, grid ``(N, C)``: program ``(row, c)`` reads chunk ``c`` (``BLOCK``
   logits) of the row once, in its own dtype, and writes the chunk's max, its
   ``sum(exp(x - max))`` and its top-k candidates (float32 logit, id). Selection runs on one
   int64 key per element: the logit as an order-preserving int32 in the high half,
   ``2**31 - 1 - id`` in the low half, so the largest key is the largest logit and, among equal
   logits, the smallest id (the tie rule), and one max reduction gives both. To keep the k
   reductions off the full chunk, it first takes the k best groups of ``GROUP`` consecutive logits
   by their maxima (the chunk's top k always lie in them), then the top k among those
   ``k * GROUP`` logits (re-read from cache).
2. ``_merge_topk_kernel``, grid ``(N,)``: combines the ``C`` chunk (max, sum) pairs into the row's
   ``lse = M + log(sum_c s_c * exp(m_c - M))``, turns the ``C * k`` candidates into log-probs
   ``x - M - log(...)`` (``log_softmax``'s formula) and selects the top ``k`` by the same key built
   on the log-probs.

The chunk programs are bound by the k selection reductions, not by reading the logits. ``span > 1``
(``_span_topk_kernel``; the default span of a shape comes from ``SPAN_TABLE``, see
``default_span``) replaces step 1 by one program per ``span``
consecutive chunks: it computes and stores each chunk's max and sum with the very same tile and
reductions (so the same floats, and the merge the same logsumexp), but runs the two k-selection
passes once for the span (over the span's group maxima, then the k best groups), on int32 keys for
bf16 logits (a bf16 value is exact in 16 bits: its order-preserving code high, ``65535 - offset in
the span`` low; ``span * block <= 65536``). The merge then sees ``span`` times fewer candidates; the
row's top k (by logit, then id) lie among them either way, so ids and log-probs are those of
``span=1`` bit for bit under the condition below (distinct logits with distinct float32 log-probs
near the k-th place; otherwise the candidate sets can differ there). The interpreter tests check it
against ``span=1``; the table's shapes are the ones checked on a GPU (docs/decisions.md, "Draft
top-k span").

Exactness against ``draft_topk(stable=True)``: the ids and their order are the same whenever no
two distinct logits of a row round to the same float32 log-prob near the k-th place (that takes
logits whose difference is below float32's resolution at the row's logsumexp; for bf16 logits,
the server's dtype, it needs ``|x| < 2**-16 * |lse|``); the log-probs are equal up to the
rounding of the row's logsumexp (the sum runs in another order than torch's), a few float32
ulps. ``tests/kernels/test_kernel_draft_topk.py`` checks both (Triton's interpreter on CPU);
``benchmarks/draft_topk.py`` times it against ``draft_topk`` on a GPU.

NaN logits are not supported (``draft_topk`` would sort them first; here they order as
their bit pattern says).
"""

from __future__ import annotations

from typing import Optional

import torch

try:  # triton is optional: without it ``draft_topk_fast`` falls back to the torch function.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

from .. import knobs
from ..core.tree import draft_topk

__all__ = [
    "MAX_FUSED_K",
    "DEFAULT_BLOCK",
    "DEFAULT_GROUP",
    "SPAN_TABLE",
    "default_span",
    "fused_draft_topk",
    "draft_topk_fast",
    "fused_available",
]

#: Largest ``k`` the fused kernel takes (k reductions per chunk; beyond this a sort is cheaper).
MAX_FUSED_K = 64
#: Logits per chunk program.
DEFAULT_BLOCK = 4096
#: Consecutive logits per pre-filter group inside a chunk (see ``_chunk_topk_kernel``).
DEFAULT_GROUP = 16


def fused_available() -> bool:
    return triton is not None


#: Chunks per selection program (``fused_draft_topk``'s ``span``) by (vocabulary size, k, logits
#: dtype), at ``DEFAULT_BLOCK`` and ``DEFAULT_GROUP``: the shapes on which a span beats one selection
#: per chunk on a GPU and gives its result bit for bit (docs/decisions.md, "Draft top-k span").
#: Every other shape takes span 1. 151936 is Qwen3's vocabulary.
SPAN_TABLE: dict[tuple[int, int, torch.dtype], int] = {
    (151936, 8, torch.bfloat16): 8,
    (151936, 15, torch.bfloat16): 8,
}


def default_span(vocab: int, k: int, dtype: torch.dtype, block: int, group: int) -> int:
    """Chunks per selection program when the caller gives none.

    ``knobs.DRAFT_TOPK_SPAN`` when set (every shape), else ``SPAN_TABLE``'s entry for the shape at
    the default block and group, else 1.
    """
    forced = knobs.DRAFT_TOPK_SPAN.get()
    if forced is not None:
        return int(forced)
    if int(block) != DEFAULT_BLOCK or int(group) != DEFAULT_GROUP:
        return 1
    return SPAN_TABLE.get((int(vocab), int(k), dtype), 1)


if triton is not None:

    @triton.jit
    def _ordered_key(x, idx):
        """int64 key: float32 ``x`` order-preserving in the high 32 bits, ``2**31-1-idx`` low."""
        bits = x.to(tl.int32, bitcast=True)
        # Negative floats: flip the magnitude bits so larger floats give larger ints.
        ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        return (ordered.to(tl.int64) << 32) | (2147483647 - idx).to(tl.int64)

    @triton.jit
    def _key_value(key):
        ordered = (key >> 32).to(tl.int32)
        bits = tl.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered)
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _key_index(key):
        return 2147483647 - (key & 0xFFFFFFFF).to(tl.int32)

    @triton.jit
    def _chunk_topk_kernel(
        logits_ptr,
        row_stride,
        vocab,
        cand_val_ptr,  # [N, C, K] float32
        cand_idx_ptr,  # [N, C, K] int32
        chunk_max_ptr,  # [N, C] float32
        chunk_sum_ptr,  # [N, C] float32
        num_chunks,
        K: tl.constexpr,
        K_P2: tl.constexpr,
        BLOCK: tl.constexpr,
        GROUP: tl.constexpr,
    ):
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        row_ptr = logits_ptr + row.to(tl.int64) * row_stride
        groups = tl.arange(0, BLOCK // GROUP)
        offs = chunk * BLOCK + groups[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        valid = offs < vocab
        x = tl.load(row_ptr + offs, mask=valid, other=float("-inf")).to(tl.float32)
        m = tl.max(tl.max(x, axis=1), axis=0)
        # A chunk of -inf only: its sum is 0, its max -inf.
        safe_m = tl.where(m == float("-inf"), 0.0, m)
        s = tl.sum(tl.sum(tl.where(valid, tl.exp(x - safe_m), 0.0), axis=1), axis=0)
        base = row.to(tl.int64) * num_chunks + chunk
        tl.store(chunk_max_ptr + base, m)
        tl.store(chunk_sum_ptr + base, s)
        # Pre-filter: the chunk's top K (by logit, then smaller id) lie in the K groups of GROUP
        # consecutive ids with the largest (group max, smaller group index): every group ranked
        # before an element's own group holds a distinct element ranked before that element.
        g_first = chunk * BLOCK + groups * GROUP
        g_valid = g_first < vocab
        gkey = tl.where(g_valid, _ordered_key(tl.max(x, axis=1), g_first), -9223372036854775807 - 1)
        slot = tl.arange(0, K_P2)
        sel = tl.full((K_P2,), -1, tl.int32)
        for j in tl.static_range(K):
            best = tl.max(gkey, axis=0)
            sel = tl.where(slot == j, tl.where(best == -9223372036854775807 - 1, -1, _key_index(best)), sel)
            gkey = tl.where(gkey == best, -9223372036854775807 - 1, gkey)
        # Re-read the selected groups (K * GROUP logits, just loaded: L1/L2 hits) and select.
        c_offs = sel[:, None] + tl.arange(0, GROUP)[None, :]
        c_valid = (sel[:, None] >= 0) & (c_offs < vocab)
        cx = tl.load(row_ptr + c_offs, mask=c_valid, other=float("-inf")).to(tl.float32)
        key = tl.where(c_valid, _ordered_key(cx, c_offs), -9223372036854775807 - 1)
        for j in tl.static_range(K):
            best = tl.max(tl.max(key, axis=1), axis=0)
            tl.store(cand_val_ptr + base * K + j, _key_value(best))
            # A chunk with fewer than K logits (the vocabulary's tail) yields the sentinel: id -1.
            idx = tl.where(best == -9223372036854775807 - 1, -1, _key_index(best))
            tl.store(cand_idx_ptr + base * K + j, idx)
            key = tl.where(key == best, -9223372036854775807 - 1, key)

    @triton.jit
    def _enc16(x):
        """bf16-valued float32 -> its order-preserving 16-bit code, sign-extended to int32."""
        b = x.to(tl.int32, bitcast=True) >> 16
        return tl.where(b < 0, b ^ 0x7FFF, b)

    @triton.jit
    def _dec16(code):
        b = tl.where(code < 0, code ^ 0x7FFF, code)
        return (b << 16).to(tl.float32, bitcast=True)

    @triton.jit
    def _span_key(x, local, glob, KEY32: tl.constexpr):
        """Selection key of logit ``x`` (float32) at ``local`` offset in the program's span
        (``glob`` in the row): int32 ``code16(x) << 16 | 65535 - local`` for bf16 logits, else
        ``_ordered_key``. Same order either way: larger logit first, then the smaller id."""
        if KEY32:
            return (_enc16(x) << 16) | (65535 - local)
        else:
            return _ordered_key(x, glob)

    @triton.jit
    def _span_topk_kernel(
        logits_ptr,
        row_stride,
        vocab,
        cand_val_ptr,  # [N, P, K] float32 (P = programs per row)
        cand_idx_ptr,  # [N, P, K] int32
        chunk_max_ptr,  # [N, C] float32
        chunk_sum_ptr,  # [N, C] float32
        num_chunks,
        num_progs,
        K: tl.constexpr,
        K_P2: tl.constexpr,
        BLOCK: tl.constexpr,
        GROUP: tl.constexpr,
        SPAN: tl.constexpr,
        KEY32: tl.constexpr,
    ):
        """``_chunk_topk_kernel`` over ``SPAN`` consecutive chunks per program: each chunk's max
        and sum are computed and stored exactly as there (same tile, same reductions), the k
        selections run once for the span (on int32 keys for bf16 logits)."""
        row = tl.program_id(0)
        prog = tl.program_id(1)
        row_ptr = logits_ptr + row.to(tl.int64) * row_stride
        NG: tl.constexpr = BLOCK // GROUP
        if KEY32:
            SENT: tl.constexpr = -2147483647 - 1
        else:
            SENT: tl.constexpr = -9223372036854775807 - 1
        groups = tl.arange(0, NG)
        spans = tl.arange(0, SPAN)
        span_start = prog * (SPAN * BLOCK)
        if KEY32:
            gkeys = tl.full((SPAN, NG), -2147483647 - 1, tl.int32)
        else:
            gkeys = tl.full((SPAN, NG), -9223372036854775807 - 1, tl.int64)
        for sc in tl.static_range(SPAN):
            chunk = prog * SPAN + sc
            # -- as _chunk_topk_kernel (the chunk's max and sum: identical reductions) --
            offs = chunk * BLOCK + groups[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
            valid = offs < vocab
            x = tl.load(row_ptr + offs, mask=valid, other=float("-inf")).to(tl.float32)
            m = tl.max(tl.max(x, axis=1), axis=0)
            safe_m = tl.where(m == float("-inf"), 0.0, m)
            s = tl.sum(tl.sum(tl.where(valid, tl.exp(x - safe_m), 0.0), axis=1), axis=0)
            base = row.to(tl.int64) * num_chunks + chunk
            in_row = chunk < num_chunks
            tl.store(chunk_max_ptr + base, m, mask=in_row)
            tl.store(chunk_sum_ptr + base, s, mask=in_row)
            # -- the chunk's group maxima, keyed by (group max, smaller group) --
            g_local = sc * NG + groups
            g_first = chunk * BLOCK + groups * GROUP
            gk = tl.where(g_first < vocab, _span_key(tl.max(x, axis=1), g_local, g_first, KEY32), SENT)
            gkeys = tl.where(spans[:, None] == sc, gk[None, :], gkeys)
        # The span's top K lie in its K best groups (same argument as _chunk_topk_kernel).
        slot = tl.arange(0, K_P2)
        sel = tl.full((K_P2,), -1, tl.int32)  # local group index in the span, -1: none
        for j in tl.static_range(K):
            best = tl.max(tl.max(gkeys, axis=1), axis=0)
            if KEY32:
                g_best = 65535 - (best & 0xFFFF)
            else:
                g_best = (_key_index(best) - span_start) // GROUP
            sel = tl.where(slot == j, tl.where(best == SENT, -1, g_best), sel)
            gkeys = tl.where(gkeys == best, SENT, gkeys)
        c_local = sel[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        c_offs = span_start + c_local
        c_valid = (sel[:, None] >= 0) & (c_offs < vocab)
        cx = tl.load(row_ptr + c_offs, mask=c_valid, other=float("-inf")).to(tl.float32)
        key = tl.where(c_valid, _span_key(cx, c_local, c_offs, KEY32), SENT)
        out = (row.to(tl.int64) * num_progs + prog) * K
        for j in tl.static_range(K):
            best = tl.max(tl.max(key, axis=1), axis=0)
            if KEY32:
                val = _dec16(best >> 16)
                idx = span_start + 65535 - (best & 0xFFFF)
            else:
                val = _key_value(best)
                idx = _key_index(best)
            tl.store(cand_val_ptr + out + j, val)
            # Fewer than K logits in the span (the vocabulary's tail): the sentinel, id -1.
            tl.store(cand_idx_ptr + out + j, tl.where(best == SENT, -1, idx))
            key = tl.where(key == best, SENT, key)

    @triton.jit
    def _merge_topk_kernel(
        cand_val_ptr,
        cand_idx_ptr,
        chunk_max_ptr,
        chunk_sum_ptr,
        out_lp_ptr,  # [N, K] float32
        out_idx_ptr,  # [N, K] int64
        num_chunks,
        num_cand_chunks,  # candidate blocks of K per row (num_chunks, or the span programs)
        K: tl.constexpr,
        CHUNKS_P2: tl.constexpr,
        CANDS_P2: tl.constexpr,
    ):
        row = tl.program_id(0)
        c = tl.arange(0, CHUNKS_P2)
        c_ok = c < num_chunks
        base = row.to(tl.int64) * num_chunks
        m = tl.load(chunk_max_ptr + base + c, mask=c_ok, other=float("-inf"))
        s = tl.load(chunk_sum_ptr + base + c, mask=c_ok, other=0.0)
        big_m = tl.max(m, axis=0)
        safe_big = tl.where(big_m == float("-inf"), 0.0, big_m)
        scale = tl.where(m == float("-inf"), 0.0, tl.exp(m - safe_big))
        log_total = tl.log(tl.sum(s * scale, axis=0))

        i = tl.arange(0, CANDS_P2)
        n_cands = num_cand_chunks * K
        i_ok = i < n_cands
        cbase = row.to(tl.int64) * n_cands
        cval = tl.load(cand_val_ptr + cbase + i, mask=i_ok, other=float("-inf"))
        cidx = tl.load(cand_idx_ptr + cbase + i, mask=i_ok, other=-1)
        i_ok = i_ok & (cidx >= 0)
        lp = (cval - safe_big) - log_total  # log_softmax: x - max - log(sum(exp(x - max)))
        key = tl.where(i_ok, _ordered_key(lp, cidx), -9223372036854775807 - 1)
        out = row.to(tl.int64) * K
        for j in tl.static_range(K):
            best = tl.max(key, axis=0)
            tl.store(out_lp_ptr + out + j, _key_value(best))
            tl.store(out_idx_ptr + out + j, _key_index(best).to(tl.int64))
            key = tl.where(key == best, -9223372036854775807 - 1, key)


def fused_draft_topk(
    logits: torch.Tensor,
    k: int,
    block: int = DEFAULT_BLOCK,
    num_warps: Optional[int] = None,
    group: Optional[int] = None,
    span: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``draft_topk(logits, k, stable=True)`` for ``[..., V]`` logits from one pass over them.

    Args:
        logits: ``[..., V]`` float32, float16 or bfloat16; the last dimension contiguous.
        k: entries per row, ``1 <= k <= min(V, MAX_FUSED_K)``.
        block: logits per chunk program (a power of two).
        num_warps: warps per chunk program (default: ``block // 512``, at least 4).
        group: consecutive logits per pre-filter group (a power of two <= ``block / 2``; default
            ``min(DEFAULT_GROUP, block / 2)``).
        span: chunks per selection program (a power of two <= 16; 1: ``_chunk_topk_kernel``, one
            selection per chunk; more: ``_span_topk_kernel``, one per ``span`` chunks, the same
            chunk sums, so the same result bit for bit). Default: ``default_span(...)``.

    Returns:
        ``(log_probs, token_ids)``: ``[..., k]`` float32 descending, int64; ties: smaller id first.
    """
    if triton is None:
        raise RuntimeError("fused_draft_topk needs triton; use core.tree.draft_topk")
    vocab = int(logits.shape[-1])
    if not 1 <= int(k) <= min(vocab, MAX_FUSED_K):
        raise ValueError(f"fused_draft_topk: k must be in 1..{min(vocab, MAX_FUSED_K)}, got {k}")
    if logits.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"fused_draft_topk: logits must be float32/float16/bfloat16, got {logits.dtype}")
    if block & (block - 1) or block < 16:
        raise ValueError(f"fused_draft_topk: block must be a power of two >= 16, got {block}")
    if group is None:
        group = min(DEFAULT_GROUP, block // 2)
    if group & (group - 1) or not 1 <= group <= block // 2:
        raise ValueError(f"fused_draft_topk: group must be a power of two <= block / 2, got {group}")
    if vocab >= 2**31:
        raise ValueError(f"fused_draft_topk: vocabulary of {vocab} does not fit int32 ids")
    k = int(k)
    lead = tuple(logits.shape[:-1])
    x = logits.reshape(-1, vocab)
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows = int(x.shape[0])
    out_lp = torch.empty((rows, k), dtype=torch.float32, device=x.device)
    out_ids = torch.empty((rows, k), dtype=torch.int64, device=x.device)
    if rows == 0:
        return out_lp.view(*lead, k), out_ids.view(*lead, k)
    chunks = triton.cdiv(vocab, block)
    chunk_max = torch.empty((rows, chunks), dtype=torch.float32, device=x.device)
    chunk_sum = torch.empty((rows, chunks), dtype=torch.float32, device=x.device)
    warps = num_warps if num_warps is not None else max(4, min(16, block // 512))
    if span is None:
        span = default_span(vocab, k, x.dtype, block, group)
    span = int(span)
    if span & (span - 1) or not 1 <= span <= 16:
        raise ValueError(f"fused_draft_topk: span must be a power of two in 1..16, got {span}")
    span = min(span, triton.next_power_of_2(chunks))
    if span == 1:
        cand_chunks = chunks
        cand_val = torch.empty((rows, chunks, k), dtype=torch.float32, device=x.device)
        cand_idx = torch.empty((rows, chunks, k), dtype=torch.int32, device=x.device)
        _chunk_topk_kernel[(rows, chunks)](
            x,
            x.stride(0),
            vocab,
            cand_val,
            cand_idx,
            chunk_max,
            chunk_sum,
            chunks,
            K=k,
            K_P2=triton.next_power_of_2(k),
            BLOCK=block,
            GROUP=group,
            num_warps=warps,
        )
    else:
        cand_chunks = triton.cdiv(chunks, span)
        cand_val = torch.empty((rows, cand_chunks, k), dtype=torch.float32, device=x.device)
        cand_idx = torch.empty((rows, cand_chunks, k), dtype=torch.int32, device=x.device)
        # int32 keys carry a 16-bit value (bf16 logits are exact in it) and a 16-bit offset.
        key32 = x.dtype == torch.bfloat16 and span * block <= 65536
        _span_topk_kernel[(rows, cand_chunks)](
            x,
            x.stride(0),
            vocab,
            cand_val,
            cand_idx,
            chunk_max,
            chunk_sum,
            chunks,
            cand_chunks,
            K=k,
            K_P2=triton.next_power_of_2(k),
            BLOCK=block,
            GROUP=group,
            SPAN=span,
            KEY32=key32,
            num_warps=warps,
        )
    cands_p2 = triton.next_power_of_2(cand_chunks * k)
    _merge_topk_kernel[(rows,)](
        cand_val,
        cand_idx,
        chunk_max,
        chunk_sum,
        out_lp,
        out_ids,
        chunks,
        cand_chunks,
        K=k,
        CHUNKS_P2=triton.next_power_of_2(chunks),
        CANDS_P2=cands_p2,
        num_warps=4 if cands_p2 <= 1024 else 8,
    )
    return out_lp.view(*lead, k), out_ids.view(*lead, k)


def draft_topk_fast(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The worker's draft top-k: the fused kernel on CUDA tensors, ``draft_topk`` elsewhere.

    Both give ``draft_topk(stable=True)``'s result (the fused one up to the float32 rounding
    noted in the module docstring).
    """
    if logits.is_cuda and triton is not None and int(k) <= min(int(logits.shape[-1]), MAX_FUSED_K):
        return fused_draft_topk(logits, k)
    return draft_topk(logits, k, stable=True)
