"""GPU DDTree tree builder: one Triton program per request, the best-first frontier in registers.

``build_tree_kernel`` returns the same ``DDTreeBatch`` as ``core.tree.build_tree_batched`` and, per
request, ``core.heap.build_tree_heap`` -- bit for bit, exact ties and float32 score rounding
included (docs/core.md section 2). ``build_tree`` dispatches: CUDA tensors go to the kernel, any
other device to ``build_tree_batched``.

The launch is free of host synchronisation: the wrapper looks only at shapes, dtypes and devices
(never at values), the grid is ``(B,)``, the pop loop runs a fixed ``budget`` steps on the device
(a request whose frontier ran dry just stops emitting), so a launch can be captured in a CUDA graph
and replayed with new inputs written into the same buffers.

Kernel design (docs/kernels.md has the long form). Program ``b`` owns request ``b``. As in
``build_tree_batched``, every slot owns at most one frontier candidate (its next unexpanded child),
so the frontier is a set of register vectors indexed by slot (``NP`` = next power of two >=
budget entries; the last slot's candidate can never be popped and needs no entry):

* ``f_ord``   int32: the candidate's float32 score mapped to an order-preserving integer;
  ``INT32_MIN`` marks "no candidate" (strictly below the image of ``-inf``, so ``-inf`` scores
  stay valid candidates and tie among themselves by rank tuple, as in the heap).
* ``f_k0..3`` int64: the candidate's rank tuple packed as in ``core.tree.rank_key_layout``
  (``W`` words; lexicographic order with a proper prefix first).
* ``f_meta``  int32: ``slot | rank << 10 | depth << 17`` (the candidate's own rank and depth).
* ``f_c0``    float32: ``log_probs[depth][0]``, the first-child log-prob of the candidate once it
  is popped (carried through the reduction so the child's score needs no dependent load).
* ``f_next``  float32: ``log_probs[depth - 1][rank + 1]``, the next sibling's log-prob.
* ``f_pscore`` float32: the score of the slot that owns the candidate (its parent).

One pop step is a single tuple reduction over the frontier (max score, then smallest packed key;
keys are unique, so the winner is unique), then element-wise updates: the winner's entry moves on
to its next sibling (``fl32(parent score + log_probs[depth-1][rank+1])``) and the new slot's entry
becomes its first child (``fl32(score + log_probs[depth][0])``) -- the same single float32 addition
per node as every other builder. Emitted nodes are accumulated in two register vectors (packed
parent/rank/depth, score) and written once, coalesced, at the end together with the padding; the
token ids are gathered then as well. No global store happens inside the loop.
"""

from __future__ import annotations

import torch

from ..core.tree import (
    PAD_DEPTH,
    PAD_PARENT,
    PAD_RANK,
    PAD_SCORE,
    PAD_TOKEN,
    DDTreeBatch,
    build_tree_batched,
    rank_key_layout,
)

try:  # triton is optional: without it ``build_tree`` still works through the torch builder.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None

__all__ = [
    "MAX_BUDGET",
    "MAX_DEPTH",
    "MAX_TOP_K",
    "KernelConfig",
    "kernel_config",
    "check_kernel_limits",
    "empty_tree_batch",
    "build_tree_kernel",
    "build_tree",
    "triton_available",
]

#: Largest budget (drafted nodes per request) the kernel accepts: the frontier (up to 512 entries)
#: lives in registers.
MAX_BUDGET = 512
#: Largest depth limit ``L`` (draft positions): depth is packed in 6 bits of ``f_meta``.
MAX_DEPTH = 32
#: Largest effective top-k (``min(top_k_cap, K)``): rank is packed in 7 bits of ``f_meta`` and
#: the rank-tuple key then needs at most 4 int64 words for ``L = 32``.
MAX_TOP_K = 64
_MAX_WORDS = 4

# These mirror the PAD_* constants of the canonical format (asserted below, used in the kernel).
assert (PAD_TOKEN, PAD_PARENT, PAD_DEPTH, PAD_RANK) == (0, -1, 0, -1) and PAD_SCORE == float("-inf")


def triton_available() -> bool:
    """True when triton is importable (the kernel can run: on CUDA, or on CPU in the interpreter)."""
    return triton is not None


class KernelConfig(tuple):
    """The compile-time parameters of one kernel variant (what the AOT warm-up compiles).

    Fields: ``budget`` (constexpr BUDGET: the pop loop's trip count), ``block`` (constexpr NP, the
    power of two >= budget), ``words`` (constexpr W, int64 words of a packed rank tuple),
    ``bits`` and ``per_word`` (the rank-key layout: runtime arguments, listed for the manifest),
    ``num_warps``. ``HAS_ROOT`` (whether ``root_tokens`` is given) is the only other constexpr.
    """

    __slots__ = ()
    _fields = ("budget", "block", "words", "bits", "per_word", "num_warps")

    def __new__(cls, budget: int, block: int, words: int, bits: int, per_word: int, num_warps: int):
        return super().__new__(cls, (budget, block, words, bits, per_word, num_warps))

    budget = property(lambda self: self[0])
    block = property(lambda self: self[1])
    words = property(lambda self: self[2])
    bits = property(lambda self: self[3])
    per_word = property(lambda self: self[4])
    num_warps = property(lambda self: self[5])

    def as_dict(self) -> dict:
        return dict(zip(self._fields, self))

    def __repr__(self) -> str:
        return "KernelConfig(" + ", ".join(f"{k}={v}" for k, v in zip(self._fields, self)) + ")"


def default_num_warps(block: int) -> int:
    """Warps per program for a frontier of ``block`` entries (the fastest per size, docs/kernels.md)."""
    if block <= 128:
        return 1
    if block <= 256:
        return 2
    return 4


def check_kernel_limits(depth_limit: int, width: int, budget: int, top_k_cap: int | None = None) -> int:
    """Raise ``ValueError`` (naming the parameter) when the kernel cannot take these sizes.

    Returns the effective top-k ``cap = min(top_k_cap, K)``.
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    if budget > MAX_BUDGET:
        raise ValueError(f"budget={budget} exceeds the GPU tree kernel's limit of {MAX_BUDGET}")
    if top_k_cap is not None and int(top_k_cap) < 1:
        raise ValueError(f"top_k_cap must be >= 1, got {top_k_cap}")
    if depth_limit > MAX_DEPTH:
        raise ValueError(
            f"depth limit L={depth_limit} (log_probs.shape[1]) exceeds the GPU tree kernel's limit of {MAX_DEPTH}"
        )
    cap = int(width) if top_k_cap is None else min(int(top_k_cap), int(width))
    if cap > MAX_TOP_K:
        raise ValueError(
            f"top-k {cap} (min(top_k_cap, K), K = log_probs.shape[2] = {width}) exceeds the GPU tree "
            f"kernel's limit of {MAX_TOP_K}; pass top_k_cap <= {MAX_TOP_K}"
        )
    return cap


def kernel_config(
    depth_limit: int, width: int, budget: int, top_k_cap: int | None = None, num_warps: int | None = None
) -> KernelConfig:
    """The kernel variant used for these sizes (validated with ``check_kernel_limits``)."""
    cap = check_kernel_limits(depth_limit, width, budget, top_k_cap)
    bits, per_word, words = rank_key_layout(max(int(depth_limit), 1), max(cap, 1))
    assert words <= _MAX_WORDS
    block = 1 << max(0, (max(int(budget), 1) - 1).bit_length())
    if num_warps is None:
        num_warps = default_num_warps(block)
    if num_warps not in (1, 2, 4, 8):
        raise ValueError(f"num_warps must be 1, 2, 4 or 8, got {num_warps}")
    return KernelConfig(int(budget), block, words, bits, per_word, int(num_warps))


def empty_tree_batch(batch: int, budget: int, device: torch.device | str) -> DDTreeBatch:
    """Uninitialised output buffers of the canonical shapes/dtypes (for ``out=``, e.g. in a graph)."""
    n = int(budget) + 1
    return DDTreeBatch(
        tokens=torch.empty((batch, n), dtype=torch.int64, device=device),
        parents=torch.empty((batch, n), dtype=torch.int32, device=device),
        depths=torch.empty((batch, n), dtype=torch.int32, device=device),
        ranks=torch.empty((batch, n), dtype=torch.int32, device=device),
        scores=torch.empty((batch, n), dtype=torch.float32, device=device),
        num_nodes=torch.empty((batch,), dtype=torch.int32, device=device),
    )


if triton is not None:

    @triton.jit
    def _to_ord(x):
        # float32 -> int32 with the same order (for non-NaN values; -0.0 never occurs as a score).
        b = x.to(tl.int32, bitcast=True)
        return b ^ ((b >> 31) & 0x7FFFFFFF)

    @triton.jit
    def _from_ord(o):
        b = o ^ ((o >> 31) & 0x7FFFFFFF)
        return b.to(tl.float32, bitcast=True)

    @triton.jit
    def _level_unit(level, bits, per_word, W: tl.constexpr):
        """(word, 1 << shift) of a rank-tuple level in the packed key (``rank_key_layout``).

        No integer division (per_word is a runtime value): W <= 4, so the word is a sum of compares.
        """
        if W == 1:
            word = level * 0
        else:
            word = (level >= per_word).to(tl.int32)
            if W >= 3:
                word += (level >= 2 * per_word).to(tl.int32)
            if W >= 4:
                word += (level >= 3 * per_word).to(tl.int32)
        field = level - word * per_word
        unit = tl.full([], 1, tl.int64) << (bits * (per_word - 1 - field)).to(tl.int64)
        return word, unit

    # Combine functions of the pop reduction: higher score wins; equal scores: smaller packed rank
    # tuple (words compared in order) wins. One per key width W.
    @triton.jit
    def _pick_w1(o1, a1, m1, c1, o2, a2, m2, c2):
        take1 = (o1 > o2) | ((o1 == o2) & (a1 < a2))
        return (tl.where(take1, o1, o2), tl.where(take1, a1, a2), tl.where(take1, m1, m2), tl.where(take1, c1, c2))

    @triton.jit
    def _pick_w2(o1, a1, b1, m1, c1, o2, a2, b2, m2, c2):
        lt = (a1 < a2) | ((a1 == a2) & (b1 < b2))
        take1 = (o1 > o2) | ((o1 == o2) & lt)
        return (
            tl.where(take1, o1, o2),
            tl.where(take1, a1, a2),
            tl.where(take1, b1, b2),
            tl.where(take1, m1, m2),
            tl.where(take1, c1, c2),
        )

    @triton.jit
    def _pick_w3(o1, a1, b1, e1, m1, c1, o2, a2, b2, e2, m2, c2):
        lt = (a1 < a2) | ((a1 == a2) & ((b1 < b2) | ((b1 == b2) & (e1 < e2))))
        take1 = (o1 > o2) | ((o1 == o2) & lt)
        return (
            tl.where(take1, o1, o2),
            tl.where(take1, a1, a2),
            tl.where(take1, b1, b2),
            tl.where(take1, e1, e2),
            tl.where(take1, m1, m2),
            tl.where(take1, c1, c2),
        )

    @triton.jit
    def _pick_w4(o1, a1, b1, e1, g1, m1, c1, o2, a2, b2, e2, g2, m2, c2):
        lt = (a1 < a2) | ((a1 == a2) & ((b1 < b2) | ((b1 == b2) & ((e1 < e2) | ((e1 == e2) & (g1 < g2))))))
        take1 = (o1 > o2) | ((o1 == o2) & lt)
        return (
            tl.where(take1, o1, o2),
            tl.where(take1, a1, a2),
            tl.where(take1, b1, b2),
            tl.where(take1, e1, e2),
            tl.where(take1, g1, g2),
            tl.where(take1, m1, m2),
            tl.where(take1, c1, c2),
        )

    # No value specialisation of the runtime arguments (ints equal to 1 or divisible by 16, pointer
    # alignment): one compiled variant per (BUDGET, NP, W, HAS_ROOT, num_warps), whatever the
    # shapes and allocations, so the AOT warm-up's cache entries are exactly the ones used.
    _RUNTIME_ARGS = [
        "lp_ptr",
        "ids_ptr",
        "root_ptr",
        "tok_ptr",
        "par_ptr",
        "dep_ptr",
        "rank_ptr",
        "score_ptr",
        "num_ptr",
        "L",
        "K",
        "cap",
        "bits",
        "per_word",
    ]

    @triton.jit(do_not_specialize=_RUNTIME_ARGS, do_not_specialize_on_alignment=_RUNTIME_ARGS)
    def _ddtree_build_kernel(
        lp_ptr,
        ids_ptr,
        root_ptr,
        tok_ptr,
        par_ptr,
        dep_ptr,
        rank_ptr,
        score_ptr,
        num_ptr,
        L,
        K,
        cap,
        bits,
        per_word,
        BUDGET: tl.constexpr,
        NP: tl.constexpr,
        W: tl.constexpr,
        HAS_ROOT: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        lp = lp_ptr + b * L * K
        ids = ids_ptr + b * L * K
        n_slots = BUDGET + 1
        o_base = b * n_slots

        NEG_INF: tl.constexpr = float("-inf")
        INVALID: tl.constexpr = -2147483648
        offs = tl.arange(0, NP)
        one64 = tl.full([NP], 1, tl.int64)

        # Entry 0: the root's first child (0,) -- depth 1, rank 0, parent score 0.0.
        root_ok = (L >= 1) & (cap >= 1)
        lp00 = tl.load(lp, mask=root_ok, other=0.0)
        c0_root = tl.load(lp + K, mask=root_ok & (L >= 2), other=NEG_INF)
        nx_root = tl.load(lp + 1, mask=root_ok & (cap >= 2), other=NEG_INF)
        is0 = (offs == 0) & root_ok
        f_ord = tl.where(is0, _to_ord(0.0 + lp00), INVALID)
        f_meta = tl.where(offs == 0, 1 << 17, offs)
        f_c0 = tl.where(offs == 0, c0_root, NEG_INF)
        f_next = tl.where(offs == 0, nx_root, NEG_INF)
        f_pscore = tl.zeros([NP], tl.float32)
        root_unit = one64 << (bits * (per_word - 1)).to(tl.int64)
        f_k0 = tl.where(offs == 0, root_unit, 0)
        f_k1 = tl.zeros([NP], tl.int64)
        f_k2 = tl.zeros([NP], tl.int64)
        f_k3 = tl.zeros([NP], tl.int64)

        # Emitted nodes: o_* index j is slot j + 1.
        o_meta = tl.zeros([NP], tl.int32)
        o_score = tl.full([NP], NEG_INF, tl.float32)
        n = tl.zeros([], tl.int32)

        for t in range(1, BUDGET + 1):
            # 1. Select: highest score, then the smallest packed rank tuple.
            if W == 1:
                b_ord, b_k0, b_meta, b_c0 = tl.reduce((f_ord, f_k0, f_meta, f_c0), 0, _pick_w1)
                b_k1 = 0
                b_k2 = 0
                b_k3 = 0
            elif W == 2:
                b_ord, b_k0, b_k1, b_meta, b_c0 = tl.reduce((f_ord, f_k0, f_k1, f_meta, f_c0), 0, _pick_w2)
                b_k2 = 0
                b_k3 = 0
            elif W == 3:
                b_ord, b_k0, b_k1, b_k2, b_meta, b_c0 = tl.reduce((f_ord, f_k0, f_k1, f_k2, f_meta, f_c0), 0, _pick_w3)
                b_k3 = 0
            else:
                b_ord, b_k0, b_k1, b_k2, b_k3, b_meta, b_c0 = tl.reduce(
                    (f_ord, f_k0, f_k1, f_k2, f_k3, f_meta, f_c0), 0, _pick_w4
                )
            active = b_ord != INVALID
            p = b_meta & 1023
            r = (b_meta >> 10) & 127
            d = b_meta >> 17  # the new node's depth, 1..L
            s = _from_ord(b_ord)

            # 2. Emit slot t (kept in registers until the end).
            at_t = (offs == t - 1) & active
            o_meta = tl.where(at_t, b_meta, o_meta)
            o_score = tl.where(at_t, s, o_score)
            n += active.to(tl.int32)

            # 3. The winner's entry moves on to its next sibling (rank r + 1).
            is_p = (offs == p) & active
            sib_ok = is_p & (r + 1 < cap)
            sib_ord = _to_ord(f_pscore + f_next)
            f_ord = tl.where(is_p, tl.where(sib_ok, sib_ord, INVALID), f_ord)
            f_meta = tl.where(is_p, f_meta + (1 << 10), f_meta)
            nx = tl.load(lp + (d - 1) * K + r + 2, mask=active & (r + 2 < cap), other=NEG_INF)
            f_next = tl.where(is_p, nx, f_next)
            s_word, s_unit = _level_unit(d - 1, bits, per_word, W)
            f_k0 = tl.where(sib_ok & (s_word == 0), f_k0 + s_unit, f_k0)
            if W >= 2:
                f_k1 = tl.where(sib_ok & (s_word == 1), f_k1 + s_unit, f_k1)
            if W >= 3:
                f_k2 = tl.where(sib_ok & (s_word == 2), f_k2 + s_unit, f_k2)
            if W >= 4:
                f_k3 = tl.where(sib_ok & (s_word == 3), f_k3 + s_unit, f_k3)

            # 4. Slot t's entry becomes its first child (rank 0, depth d + 1).
            child_ok = active & (d < L)
            at_c = (offs == t) & child_ok
            f_ord = tl.where(at_c, _to_ord(s + b_c0), f_ord)
            f_meta = tl.where(offs == t, t | ((d + 1) << 17), f_meta)
            f_pscore = tl.where(offs == t, s, f_pscore)
            c_next = tl.load(lp + d * K + 1, mask=child_ok & (cap >= 2), other=NEG_INF)
            c_c0 = tl.load(lp + (d + 1) * K, mask=child_ok & (d + 1 < L), other=NEG_INF)
            f_next = tl.where(offs == t, c_next, f_next)
            f_c0 = tl.where(offs == t, c_c0, f_c0)
            c_word, c_unit = _level_unit(d, bits, per_word, W)
            f_k0 = tl.where(offs == t, b_k0 + tl.where(c_word == 0, c_unit, 0), f_k0)
            if W >= 2:
                f_k1 = tl.where(offs == t, b_k1 + tl.where(c_word == 1, c_unit, 0), f_k1)
            if W >= 3:
                f_k2 = tl.where(offs == t, b_k2 + tl.where(c_word == 2, c_unit, 0), f_k2)
            if W >= 4:
                f_k3 = tl.where(offs == t, b_k3 + tl.where(c_word == 3, c_unit, 0), f_k3)

        # Write slots 1..budget (nodes, then padding) and the root slot.
        slot = offs + 1
        in_range = slot <= BUDGET
        is_node = offs < n
        o_par = o_meta & 1023
        o_rank = (o_meta >> 10) & 127
        o_dep = o_meta >> 17
        tok = tl.load(ids + (o_dep - 1) * K + o_rank, mask=in_range & is_node, other=0)
        out = o_base + slot
        tl.store(tok_ptr + out, tl.where(is_node, tok, 0), mask=in_range)
        tl.store(par_ptr + out, tl.where(is_node, o_par, -1), mask=in_range)
        tl.store(dep_ptr + out, tl.where(is_node, o_dep, 0), mask=in_range)
        tl.store(rank_ptr + out, tl.where(is_node, o_rank, -1), mask=in_range)
        tl.store(score_ptr + out, tl.where(is_node, o_score, NEG_INF), mask=in_range)
        if HAS_ROOT:
            root_tok = tl.load(root_ptr + b)
        else:
            root_tok = tl.zeros([], tl.int64)
        tl.store(tok_ptr + o_base, root_tok)
        tl.store(par_ptr + o_base, -1)
        tl.store(dep_ptr + o_base, 0)
        tl.store(rank_ptr + o_base, 0)
        tl.store(score_ptr + o_base, 0.0)
        tl.store(num_ptr + b, n)


def _check_out(out: DDTreeBatch, batch: int, budget: int, device: torch.device) -> None:
    want = empty_tree_batch(0, budget, "meta")
    for f in ("tokens", "parents", "depths", "ranks", "scores", "num_nodes"):
        t, w = getattr(out, f), getattr(want, f)
        shape = (batch, *w.shape[1:])
        if tuple(t.shape) != shape or t.dtype != w.dtype or t.device != device or not t.is_contiguous():
            raise ValueError(
                f"out.{f} must be a contiguous {w.dtype} tensor of shape {shape} on {device}, "
                f"got {t.dtype} {tuple(t.shape)} on {t.device}"
            )


def _launch_args(
    log_probs: torch.Tensor,
    token_ids: torch.Tensor,
    budget: int,
    top_k_cap: int | None,
    root_tokens: torch.Tensor | None,
    out: DDTreeBatch | None,
    num_warps: int | None,
) -> tuple[tuple, dict, DDTreeBatch, KernelConfig]:
    """Validate (shapes, dtypes, devices only: no values, no sync) and build the launch arguments."""
    if log_probs.dim() != 3 or tuple(token_ids.shape) != tuple(log_probs.shape):
        raise ValueError(
            f"expected log_probs and token_ids of one shape [B, L, K], got "
            f"{tuple(log_probs.shape)} and {tuple(token_ids.shape)}"
        )
    budget = int(budget)
    batch, depth_limit, width = (int(s) for s in log_probs.shape)
    cfg = kernel_config(depth_limit, width, budget, top_k_cap, num_warps)
    cap = width if top_k_cap is None else min(int(top_k_cap), width)
    device = log_probs.device
    if token_ids.device != device:
        raise ValueError(f"log_probs is on {device} but token_ids on {token_ids.device}")
    if root_tokens is not None:
        if root_tokens.numel() != batch:
            raise ValueError(f"root_tokens must have {batch} elements, got shape {tuple(root_tokens.shape)}")
        if root_tokens.device != device:
            raise ValueError(f"log_probs is on {device} but root_tokens on {root_tokens.device}")
    if out is None:
        out = empty_tree_batch(batch, budget, device)
    else:
        _check_out(out, batch, budget, device)
    lp = log_probs.to(torch.float32).contiguous()
    ids = token_ids.to(torch.int64).contiguous()
    roots = ids if root_tokens is None else root_tokens.reshape(batch).to(torch.int64).contiguous()
    args = (
        lp,
        ids,
        roots,
        out.tokens,
        out.parents,
        out.depths,
        out.ranks,
        out.scores,
        out.num_nodes,
        depth_limit,
        width,
        cap,
        cfg.bits,
        cfg.per_word,
    )
    kwargs = dict(
        BUDGET=cfg.budget,
        NP=cfg.block,
        W=cfg.words,
        HAS_ROOT=root_tokens is not None,
        num_warps=cfg.num_warps,
        num_stages=1,
    )
    return args, kwargs, out, cfg


def build_tree_kernel(
    log_probs: torch.Tensor,
    token_ids: torch.Tensor,
    budget: int,
    top_k_cap: int | None = None,
    root_tokens: torch.Tensor | None = None,
    *,
    out: DDTreeBatch | None = None,
    num_warps: int | None = None,
) -> DDTreeBatch:
    """Build a batch of DDTree trees with the Triton kernel (one launch, no host sync).

    Same arguments and result as ``core.tree.build_tree_batched``; runs on CUDA tensors (or on CPU
    tensors when ``TRITON_INTERPRET=1``, for tests). Capturable in a CUDA graph.

    Args:
        log_probs: ``[B, L, K]`` top-k log-probs, descending per position (``draft_topk``); used in
            float32 (converted if needed). ``L <= MAX_DEPTH``.
        token_ids: ``[B, L, K]`` their token ids (int64; converted if needed).
        budget: drafted nodes per request, ``0..MAX_BUDGET`` (a compile-time constant of the
            kernel: one compiled variant per budget).
        top_k_cap: ranks ``>= top_k_cap`` are never used (default ``K``); ``min(top_k_cap, K)``
            must be ``<= MAX_TOP_K``.
        root_tokens: ``[B]`` slot-0 tokens (default ``PAD_TOKEN``).
        out: optional preallocated result (``empty_tree_batch``): written in place and returned.
        num_warps: override the warps per program (default ``default_num_warps``).

    Raises:
        ValueError: bad shapes/devices, or sizes beyond the kernel's limits (naming the parameter).
        RuntimeError: triton is not installed.
    """
    if triton is None:
        raise RuntimeError("the DDTree GPU tree kernel needs triton, which is not installed")
    args, kwargs, out, _ = _launch_args(log_probs, token_ids, budget, top_k_cap, root_tokens, out, num_warps)
    batch = int(log_probs.shape[0])
    if batch:
        _ddtree_build_kernel[(batch,)](*args, **kwargs)
    return out


def build_tree(
    log_probs: torch.Tensor,
    token_ids: torch.Tensor,
    budget: int,
    top_k_cap: int | None = None,
    root_tokens: torch.Tensor | None = None,
) -> DDTreeBatch:
    """Build a batch of DDTree trees: the Triton kernel on CUDA tensors, ``build_tree_batched`` elsewhere.

    The result is the same ``DDTreeBatch`` either way. On CUDA the kernel's limits apply
    (``budget <= MAX_BUDGET``, ``L <= MAX_DEPTH``, ``min(top_k_cap, K) <= MAX_TOP_K``; a
    ``ValueError`` names the parameter otherwise); on CPU there are none.
    """
    if log_probs.is_cuda:
        return build_tree_kernel(log_probs, token_ids, budget, top_k_cap, root_tokens)
    return build_tree_batched(log_probs, token_ids, budget, top_k_cap, root_tokens)
