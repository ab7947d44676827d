"""The grouped tree-verify attention (Triton, in the interpreter on CPU) against a float32 reference.

SGLang's own extend kernel cannot run in Triton's interpreter (its loops range over loaded bounds), so
the comparison with it on the same inputs is the GPU benchmark's (``benchmarks/tree_attention.py``:
the largest difference from SGLang's masked output, docs/evidence/gpu-sglang/README.md run 8). The
inputs are float16 here: the interpreter multiplies bfloat16 tiles in ``tl.dot`` as raw 16-bit
integers, so bfloat16 results are garbage there (not on a GPU)."""

from __future__ import annotations

import os

import pytest
import torch

from sglang_overlay import knobs
from sglang_overlay.adapter.tree_verify import full_custom_mask
from sglang_overlay.kernels import tree_attention as ta

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and ta.tree_attention_available()
needs_interpreter = pytest.mark.skipif(not INTERPRETED, reason="needs triton with TRITON_INTERPRET=1 (CPU)")


def tree_ancestors(bs: int, width: int, gen: torch.Generator) -> torch.Tensor:
    """Random trees: slot 0 the root, each later slot's parent an earlier slot; ancestor-or-self."""
    anc = torch.zeros(bs, width, width, dtype=torch.bool)
    for b in range(bs):
        for i in range(width):
            anc[b, i, i] = True
            if i:
                parent = int(torch.randint(0, i, (1,), generator=gen))
                anc[b, i] |= anc[b, parent]
    return anc


def make_case(prefix_lens, width, q_heads, kv_heads, dim, seed, dtype=torch.float16, pool=512):
    """Inputs as SGLang's Triton backend hands them to ``extend_attention_fwd`` in TARGET_VERIFY."""
    gen = torch.Generator().manual_seed(seed)
    bs = len(prefix_lens)
    prefix = torch.tensor(prefix_lens, dtype=torch.int64)
    tokens = bs * width

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    q, k, v = rnd(tokens, q_heads, dim), rnd(tokens, kv_heads, dim), rnd(tokens, kv_heads, dim)
    k_buf, v_buf = rnd(pool, kv_heads, dim), rnd(pool, kv_heads, dim)
    kv_indices = torch.randperm(pool, generator=gen)[: int(prefix.sum())].to(torch.int64)
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(prefix, 0).to(torch.int32)
    qo_indptr = torch.arange(0, (bs + 1) * width, width, dtype=torch.int32)
    anc = tree_ancestors(bs, width, gen)
    mask = full_custom_mask(anc, prefix)
    mask_indptr = torch.zeros(bs + 1, dtype=torch.int64)
    mask_indptr[1:] = torch.cumsum(width * (prefix + width), 0)
    return dict(
        q=q,
        k=k,
        v=v,
        k_buf=k_buf,
        v_buf=v_buf,
        qo_indptr=qo_indptr,
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        mask=mask,
        mask_indptr=mask_indptr,
        width=width,
    )


def run_kernel(c, config=None, mask=None):
    o = torch.full_like(c["q"], float("nan"))
    ta.tree_verify_attention(
        c["q"],
        c["k"],
        c["v"],
        o,
        c["k_buf"],
        c["v_buf"],
        c["qo_indptr"],
        c["kv_indptr"],
        c["kv_indices"],
        c["mask"] if mask is None else mask,
        c["mask_indptr"],
        c["width"],
        config=config,
    )
    return o


def reference(c):
    return ta.tree_verify_attention_torch(
        c["q"],
        c["k"],
        c["v"],
        c["k_buf"],
        c["v_buf"],
        c["qo_indptr"],
        c["kv_indptr"],
        c["kv_indices"],
        c["mask"],
        c["mask_indptr"],
    )


# (prefix lengths, window, q heads, kv heads, head dim): Qwen3-8B's grouping (4 query heads a KV head)
# and window 16 at two requests; a prefix longer than one tile and one of 0; no grouping; a window
# that is not a power of 2; a group of 8 split over two programs (64 rows each); grouping 2 with dim 64;
# a window wider than a tile's 64 rows (two row blocks, the second partly past the window).
CASES = [
    ([5, 70], 16, 8, 2, 128),
    ([0, 3, 130], 8, 4, 4, 64),
    ([9], 5, 4, 1, 64),
    ([17, 1], 16, 16, 2, 64),
    ([33, 64], 4, 4, 2, 32),
    ([3, 20], 80, 4, 2, 32),
]


@needs_interpreter
@pytest.mark.parametrize("prefix,width,qh,kvh,dim", CASES)
def test_kernel_equals_the_float32_reference(prefix, width, qh, kvh, dim):
    c = make_case(prefix, width, qh, kvh, dim, seed=len(prefix) * 100 + width)
    got = run_kernel(c).float()
    assert not torch.isnan(got).any()
    assert torch.allclose(got, reference(c), atol=2e-2, rtol=2e-2)


@needs_interpreter
@pytest.mark.parametrize(
    "config",
    sorted({ta.TreeAttentionConfig(16, 32, 4), ta.TreeAttentionConfig(128, 64, 8), *ta.TILES.values()}),
)
@pytest.mark.parametrize("width", [16, 80])
def test_every_tile_config_computes_the_same(config, width):
    # Every GPU's tile included; a window of 80 takes row blocks under the tiles of fewer than 80 rows.
    c = make_case([40, 3], width, 8, 2, 64, seed=5)
    assert torch.allclose(run_kernel(c, config).float(), reference(c), atol=2e-2, rtol=2e-2)


@needs_interpreter
def test_a_bool_mask_and_its_bytes_read_the_same_and_the_mask_matters():
    c = make_case([12, 7], 8, 4, 2, 64, seed=9)
    as_bool, as_bytes = run_kernel(c), run_kernel(c, mask=c["mask"].to(torch.uint8))
    assert torch.equal(as_bool, as_bytes)
    # Planted: a causal window mask instead of the tree's gives other rows (the mask is read).
    causal = c["mask"].clone()
    start = 0
    for p in [12, 7]:
        rows = causal[start : start + 8 * (p + 8)].view(8, p + 8)
        rows[:, p:] = torch.tril(torch.ones(8, 8, dtype=torch.bool))
        start += 8 * (p + 8)
    assert not torch.allclose(run_kernel(c, mask=causal).float(), as_bool.float(), atol=1e-2)


def test_launch_shape_groups_heads_of_one_kv_head():
    assert ta.launch_shape(32, 8, 16, 64) == (4, 16)  # Qwen3-8B: 4 heads x 16 rows
    assert ta.launch_shape(32, 8, 16, 16) == (1, 16)
    assert ta.launch_shape(64, 8, 16, 64) == (4, 16)  # a group of 8 in two programs
    assert ta.launch_shape(12, 4, 16, 64) == (1, 16)  # group 3: no power of 2 > 1 divides it
    assert ta.launch_shape(8, 8, 4, 64) == (1, 16)  # no grouping: rows padded to tl.dot's 16
    assert ta.launch_shape(32, 8, 5, 64) == (4, 8)
    # A window wider than the tile: one head, the tile's rows, row blocks over the window.
    assert ta.launch_shape(32, 8, 128, 64) == (1, 64)
    assert ta.launch_shape(32, 8, 256, 48) == (1, 32)
    assert (ta.row_blocks(128, 64), ta.row_blocks(80, 64), ta.row_blocks(16, 16), ta.row_blocks(5, 16)) == (2, 2, 1, 1)


def test_config_from_env_else_the_gpus_tile():
    assert ta.config_from_env({}, capability=90) == ta.TILES[90] == (64, 64, 8)
    assert ta.config_from_env({}, capability=120) == ta.TILES[120]
    # A GPU without a row, or none known, gets the fallback tile.
    assert ta.config_from_env({}, capability=75) == ta.config_from_env({}) == ta.FALLBACK_TILE
    assert ta.config_from_env({knobs.TREE_ATTENTION_CONFIG.name: "32,32,2"}, capability=90) == (32, 32, 2)
    assert ta.config_from_env({knobs.TREE_ATTENTION_CONFIG.name: "32,32,2"}) == (32, 32, 2)
    with pytest.raises(ValueError):
        ta.config_from_env({knobs.TREE_ATTENTION_CONFIG.name: "32,32"})


def test_the_wrapper_passes_every_other_call_to_sglangs_function():
    calls = []

    def original(*args, **kwargs):
        calls.append((args, kwargs))
        return "original"

    wrapped = ta.extend_fn(original)
    assert ta.extend_fn(wrapped) is wrapped  # never wrapped twice
    q = torch.zeros(4, 2, 8, dtype=torch.bfloat16)
    # No custom mask (prefill, DFLASH's causal verify): SGLang's kernel, arguments unchanged.
    out = wrapped(q, q, q, q, q, q, None, None, None, None, True, None, 4, 1.0, 1.0, 0.5, sliding_window_size=-1)
    assert out == "original" and calls[-1][1] == {"sliding_window_size": -1} and calls[-1][0][15] == 0.5
    # A mask, but a sliding window / sinks / a page size above 1: SGLang's kernel.
    mask = torch.ones(64, dtype=torch.bool)
    for extra in ({"sliding_window_size": 8}, {"sinks": q}, {"page_size": 16}, {"logit_cap": 30.0}):
        assert wrapped(q, q, q, q, q, q, None, None, None, mask, True, None, 4, 1.0, 1.0, None, **extra) == "original"
    assert len(calls) == 5


@needs_interpreter
def test_the_wrapper_runs_the_kernel_for_a_tree_verify():
    c = make_case([6, 20], 8, 4, 2, 64, seed=11)

    def original(*args, **kwargs):
        raise AssertionError("SGLang's kernel called for a tree verify")

    o = torch.empty_like(c["q"])
    ta.extend_fn(original)(
        c["q"],
        c["k"],
        c["v"],
        o,
        c["k_buf"],
        c["v_buf"],
        c["qo_indptr"],
        c["kv_indptr"],
        c["kv_indices"],
        c["mask"],
        True,
        c["mask_indptr"],
        8,
        1.0,
        1.0,
        None,
        logit_cap=0.0,
        sliding_window_size=-1,
        sinks=None,
        window_kv_offsets=None,
        xai_temperature_len=-1,
        page_size=1,
        score_mod=None,
        aux_tensors=None,
        extend_seq_lens_cpu=None,
    )
    assert torch.equal(o, run_kernel(c))
