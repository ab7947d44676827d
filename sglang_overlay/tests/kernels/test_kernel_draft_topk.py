"""The fused draft top-k (Triton, in the interpreter on CPU) against ``core.tree.draft_topk``.

Ids must be identical (ties: smaller id first, across chunk boundaries too); log-probs equal up to
the rounding of the row's logsumexp. The shapes are small (the interpreter runs the kernel body
in numpy); several chunks per row and a short tail chunk are always exercised.
"""

from __future__ import annotations

import os

import pytest
import torch

from sglang_overlay import knobs
from sglang_overlay.core.tree import draft_topk
from sglang_overlay.kernels import draft_topk as fk

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and fk.fused_available()
needs_interpreter = pytest.mark.skipif(not INTERPRETED, reason="needs triton with TRITON_INTERPRET=1 (CPU)")


def _logits(kind: str, rows: int, vocab: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if kind == "random":
        x = torch.randn(rows, vocab, generator=gen) * 3
    elif kind == "ties":  # few distinct values: long runs of exact ties spanning chunks
        x = torch.randint(0, 4, (rows, vocab), generator=gen).to(torch.float32)
    elif kind == "neginf":  # masked-out vocabulary (-inf) and a row with fewer finite than k
        x = torch.randn(rows, vocab, generator=gen)
        x[torch.rand(rows, vocab, generator=gen) < 0.5] = float("-inf")
        x[0, :] = float("-inf")
        x[0, [5, vocab - 1]] = torch.tensor([1.0, 2.0])
    else:
        raise ValueError(kind)
    return x.to(dtype)


def _assert_same_log_probs(got: torch.Tensor, want: torch.Tensor) -> None:
    """-inf exactly where ``draft_topk`` has it; finite values within the logsumexp's rounding."""
    assert torch.equal(got.isinf(), want.isinf())
    finite = ~want.isinf()
    assert torch.allclose(got[finite], want[finite], rtol=0, atol=2e-6), (got, want)


# Each case of test_span_equals_chunk_kernel below also runs the kernel with span=1 (the default on these
# shapes) against draft_topk: 8 chunks with a tail of 104, k = the service's block - 1, k = 1 with groups
# of one, ties across groups and chunks, k close to the chunk size, -inf logits. Here, the case it runs in
# another dtype only (each case is seconds in the interpreter).
@needs_interpreter
@pytest.mark.parametrize(
    "kind,rows,vocab,k,block,group,dtype",
    [
        ("ties", 3, 256, 5, 128, 32, torch.float32),  # tied group maxima: smaller group first
    ],
)
def test_fused_equals_draft_topk(kind, rows, vocab, k, block, group, dtype):
    logits = _logits(kind, rows, vocab, dtype, seed=rows * 1000 + vocab + k)
    got_lp, got_ids = fk.fused_draft_topk(logits, k, block=block, group=group)
    want_lp, want_ids = draft_topk(logits, k, stable=True)
    assert got_ids.dtype == torch.int64 and got_lp.dtype == torch.float32
    assert torch.equal(got_ids, want_ids), (got_ids, want_ids)
    _assert_same_log_probs(got_lp, want_lp)


@needs_interpreter
def test_fused_keeps_leading_dims():
    logits = _logits("random", 6, 200, torch.bfloat16, seed=3).view(2, 3, 200)
    lp, ids = fk.fused_draft_topk(logits, 4, block=64)
    want_lp, want_ids = draft_topk(logits, 4, stable=True)
    assert lp.shape == (2, 3, 4) and torch.equal(ids, want_ids)
    _assert_same_log_probs(lp, want_lp)


@needs_interpreter
def test_fused_strided_rows():
    base = _logits("random", 4, 600, torch.bfloat16, seed=9)
    view = base[:, :500]  # rows with a stride larger than the vocabulary
    lp, ids = fk.fused_draft_topk(view, 5, block=128)
    want_lp, want_ids = draft_topk(view, 5, stable=True)
    assert torch.equal(ids, want_ids)
    _assert_same_log_probs(lp, want_lp)


@pytest.mark.skipif(not fk.fused_available(), reason="needs triton")
@pytest.mark.parametrize(
    "k,block,dtype,match",
    [
        (0, 64, torch.float32, "k must be in 1..64"),
        (65, 64, torch.float32, "k must be in 1..64"),
        (4, 100, torch.float32, "block must be a power of two"),
        (4, 64, torch.int32, "float32/float16/bfloat16"),
    ],
)
def test_fused_refuses_bad_arguments(k, block, dtype, match):
    with pytest.raises(ValueError, match=match):
        fk.fused_draft_topk(torch.zeros(2, 300, dtype=dtype), k, block=block)


def test_draft_topk_fast_falls_back_on_cpu():
    logits = _logits("ties", 3, 90, torch.float32, seed=1)
    lp, ids = fk.draft_topk_fast(logits, 5)
    want_lp, want_ids = draft_topk(logits, 5, stable=True)
    assert torch.equal(ids, want_ids) and torch.equal(lp, want_lp)


@needs_interpreter
def test_fused_ties_smaller_id_first_across_chunks():
    # Two chunks of 16; the 3.0s of the first chunk (ids 0..3) come before those of the second.
    x = torch.tensor([[3.0] * 4 + [1.0] * 12 + [3.0] * 4 + [0.0] * 12])
    _, ids = fk.fused_draft_topk(x, 6, block=16)
    assert ids.tolist() == [[0, 1, 2, 3, 16, 17]]


@needs_interpreter
@pytest.mark.parametrize(
    "kind,rows,vocab,k,block,group,span,dtype",
    [
        ("random", 2, 1000, 8, 128, 16, 2, torch.bfloat16),  # 8 chunks in 4 spans, tail of 104
        ("random", 2, 1000, 8, 128, 16, 16, torch.bfloat16),  # one span, 8 chunks past the row
        ("random", 2, 400, 15, 64, 4, 4, torch.float32),  # int64 keys (not bf16)
        ("random", 2, 300, 1, 256, 1, 2, torch.float16),  # k = 1, groups of one, int64 keys
        ("ties", 4, 520, 8, 64, 8, 4, torch.bfloat16),  # ties across groups, chunks and spans
        ("ties", 2, 100, 12, 16, 2, 8, torch.float32),  # k close to the chunk size
        ("ties", 3, 256, 5, 128, 32, 2, torch.bfloat16),  # tied group maxima: smaller group first
        ("neginf", 3, 500, 6, 64, 16, 4, torch.bfloat16),  # -inf logits, fewer finite than k
        ("neginf", 3, 500, 6, 64, 16, 8, torch.float32),
        ("signed", 3, 700, 8, 64, 16, 4, torch.bfloat16),  # +-0.0, subnormals, +-inf, negatives
    ],
)
def test_span_equals_chunk_kernel(kind, rows, vocab, k, block, group, span, dtype):
    """``span > 1`` (one selection per span of chunks): the ids and log-probs of ``span=1``, bit
    for bit (the chunk sums are the same reductions), and ``draft_topk``'s ids."""
    if kind == "signed":
        gen = torch.Generator().manual_seed(vocab + k)
        pool = torch.tensor([0.0, -0.0, 1e-40, -1e-40, float("inf"), float("-inf"), -3.5, -2.0, 2.0, 7.0])
        logits = pool[torch.randint(0, len(pool), (rows, vocab), generator=gen)].to(dtype)
        logits[:, :] = torch.where(logits.isinf() & (logits > 0), torch.tensor(-1.0, dtype=dtype), logits)
    else:
        logits = _logits(kind, rows, vocab, dtype, seed=rows * 1000 + vocab + k)
    one_lp, one_ids = fk.fused_draft_topk(logits, k, block=block, group=group, span=1)
    got_lp, got_ids = fk.fused_draft_topk(logits, k, block=block, group=group, span=span)
    assert one_ids.dtype == got_ids.dtype == torch.int64 and one_lp.dtype == got_lp.dtype == torch.float32
    assert torch.equal(got_ids, one_ids), (got_ids, one_ids)
    assert torch.equal(got_lp.view(torch.int32), one_lp.view(torch.int32)), (got_lp, one_lp)
    want_lp, want_ids = draft_topk(logits, k, stable=True)
    if kind != "signed":  # -0.0 and +0.0: equal for the sort, ordered by sign bit in the kernels
        assert torch.equal(one_ids, want_ids), (one_ids, want_ids)
    _assert_same_log_probs(one_lp, want_lp)


@needs_interpreter
def test_span_ties_smaller_id_first_across_spans():
    # Four chunks of 16 in two spans of two; the 3.0s of each span come in id order across spans.
    x = torch.tensor([[0.0] * 12 + [3.0] * 4 + [1.0] * 16 + [3.0] * 4 + [0.0] * 28]).to(torch.bfloat16)
    _, ids = fk.fused_draft_topk(x, 6, block=16, span=2)
    assert ids.tolist() == [[12, 13, 14, 15, 32, 33]]


@needs_interpreter
def test_span_int32_keys_at_the_offset_limit():
    # span * block = 65536: the last logits of a span sit at offset 65535 of its 16-bit field.
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(1, 65536 + 300, generator=gen) * 2).to(torch.bfloat16)
    x[0, 65535] = 60.0
    x[0, 65534] = 60.0
    x[0, 65536 + 299] = 60.0
    x[0, 0] = 50.0
    lp, ids = fk.fused_draft_topk(x, 5, block=4096, span=16)
    one_lp, one_ids = fk.fused_draft_topk(x, 5, block=4096, span=1)
    assert ids[0, :4].tolist() == [65534, 65535, 65835, 0]
    assert torch.equal(ids, one_ids) and torch.equal(lp.view(torch.int32), one_lp.view(torch.int32))


@pytest.mark.skipif(not fk.fused_available(), reason="needs triton")
@pytest.mark.parametrize("span", [0, 3, 32])
def test_fused_refuses_bad_span(span):
    with pytest.raises(ValueError, match="span must be a power of two"):
        fk.fused_draft_topk(torch.zeros(2, 300), 4, block=64, span=span)


def test_default_span_comes_from_the_table_at_the_default_tile(monkeypatch):
    monkeypatch.delenv(knobs.DRAFT_TOPK_SPAN.name, raising=False)
    args = dict(vocab=151936, k=8, dtype=torch.bfloat16, block=fk.DEFAULT_BLOCK, group=fk.DEFAULT_GROUP)
    assert fk.default_span(**args) == fk.SPAN_TABLE[(151936, 8, torch.bfloat16)] == 8
    assert fk.default_span(**{**args, "k": 15}) == 8
    for change in (
        {"k": 4},
        {"vocab": 512},
        {"dtype": torch.float16},
        {"dtype": torch.float32},
        {"block": 2048},
        {"group": 8},
    ):
        assert fk.default_span(**{**args, **change}) == 1, change


def test_the_knob_sets_the_span_for_every_shape(monkeypatch):
    args = dict(vocab=151936, k=8, dtype=torch.bfloat16, block=fk.DEFAULT_BLOCK, group=fk.DEFAULT_GROUP)
    monkeypatch.setenv(knobs.DRAFT_TOPK_SPAN.name, "1")
    assert fk.default_span(**args) == 1
    monkeypatch.setenv(knobs.DRAFT_TOPK_SPAN.name, "4")
    assert fk.default_span(**{**args, "vocab": 512}) == 4


@pytest.mark.parametrize("shape", list(fk.SPAN_TABLE))
def test_every_span_in_the_table_is_one_the_kernel_takes(shape):
    vocab, k, dtype = shape
    span = fk.SPAN_TABLE[shape]
    assert span & (span - 1) == 0 and 1 <= span <= 16, shape
    assert 1 <= k <= fk.MAX_FUSED_K and vocab > fk.DEFAULT_BLOCK and isinstance(dtype, torch.dtype)
    # bf16 spans select on int32 keys, which hold an offset within the span in 16 bits.
    assert dtype != torch.bfloat16 or span * fk.DEFAULT_BLOCK <= 65536, shape
