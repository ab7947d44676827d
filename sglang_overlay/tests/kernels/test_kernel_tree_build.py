"""The Triton tree kernel on CPU, in Triton's interpreter, against the heap oracle (exact, ties
included), plus argument validation and the CPU dispatch of ``build_tree``.

The interpreter runs the kernel's Python body with numpy (about 10 ms per pop step), so the shapes
here are small; the GPU file runs the same comparisons at full size on a device.
"""

from __future__ import annotations

import os

import pytest
import torch

from sglang_overlay.core.tree import build_tree_batched, rank_key_layout
from sglang_overlay.kernels import tree_build as tb

from .cases import first_mismatch, heap_batch, make_inputs

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and tb.triton_available()
needs_interpreter = pytest.mark.skipif(not INTERPRETED, reason="needs triton with TRITON_INTERPRET=1 (CPU)")


def _check(seed, batch, depth_limit, width, budget, cap=None, kind="random", roots=True, words=None):
    gen = torch.Generator().manual_seed(seed)
    lp, ids = make_inputs(gen, batch, depth_limit, width, kind)
    root_tokens = torch.randint(0, 150_000, (batch,), generator=gen) if roots else None
    if words is not None:  # the case really exercises that many key words
        eff = width if cap is None else min(cap, width)
        assert rank_key_layout(depth_limit, eff)[2] == words
    got = tb.build_tree_kernel(lp, ids, budget, cap, root_tokens)
    want = heap_batch(lp, ids, budget, cap, root_tokens)
    assert got.equals(want), first_mismatch(got, want)
    return got


@needs_interpreter
@pytest.mark.parametrize(
    "seed,batch,depth_limit,width,budget,cap,kind",
    [
        (1, 3, 5, 4, 16, None, "random"),
        (2, 2, 15, 8, 16, None, "random"),  # the service's shape (block 16), small budget
        (3, 3, 4, 6, 24, 5, "ties"),  # exact ties everywhere, top_k_cap < K
        (4, 2, 6, 3, 20, None, "ties"),
        (5, 2, 3, 3, 27, None, "neginf"),  # -inf entries and a whole -inf row
        (6, 2, 2, 2, 10, None, "random"),  # budget > the 6 nodes that exist: padding
        (7, 2, 4, 5, 9, 1, "ties"),  # top_k_cap 1: a chain
        (8, 1, 1, 4, 6, None, "random"),  # L = 1
        (9, 2, 3, 2, 1, None, "random"),  # budget 1
        (10, 2, 3, 2, 0, None, "random"),  # budget 0: root and nothing else
    ],
)
def test_kernel_equals_heap(seed, batch, depth_limit, width, budget, cap, kind):
    _check(seed, batch, depth_limit, width, budget, cap, kind)


@needs_interpreter
@pytest.mark.parametrize(
    "depth_limit,width,cap,budget,words",
    [
        (15, 16, None, 24, 2),  # bits 5, 12 levels per word: depths 13..15 in word 1
        (20, 64, None, 28, 3),  # bits 7, 9 levels per word
        (32, 64, None, 40, 4),  # the limits: L = 32, top-k 64, four words
    ],
)
def test_kernel_multiword_keys_all_ties(depth_limit, width, cap, budget, words):
    # Every score 0: the order is the pure rank-tuple order (a chain to depth L, then siblings
    # from the deepest level up), decided in every key word.
    tree = _check(11, 1, depth_limit, width, budget, cap, "zeros", words=words)
    assert int(tree.depths[0].max()) == depth_limit


@needs_interpreter
def test_kernel_without_root_tokens_and_bf16_input():
    gen = torch.Generator().manual_seed(12)
    lp, ids = make_inputs(gen, 2, 4, 4, "ties")
    got = tb.build_tree_kernel(lp.to(torch.bfloat16), ids.to(torch.int32), 12)
    want = build_tree_batched(lp.to(torch.bfloat16), ids, 12)
    assert got.equals(want), first_mismatch(got, want)
    assert got.tokens[:, 0].eq(0).all()


@needs_interpreter
def test_kernel_writes_into_out_and_noncontiguous_input():
    gen = torch.Generator().manual_seed(13)
    lp, ids = make_inputs(gen, 2, 4, 6, "random")
    lp_nc = lp.transpose(1, 2).contiguous().transpose(1, 2)  # same values, not contiguous
    assert not lp_nc.is_contiguous()
    out = tb.empty_tree_batch(2, 10, "cpu")
    out.tokens.fill_(-7)
    res = tb.build_tree_kernel(lp_nc, ids, 10, 4, torch.tensor([3, 4]), out=out)
    assert res is out
    want = heap_batch(lp, ids, 10, 4, torch.tensor([3, 4]))
    assert out.equals(want), first_mismatch(out, want)


@needs_interpreter
def test_empty_batch():
    lp = torch.zeros(0, 5, 4)
    got = tb.build_tree_kernel(lp, torch.zeros(0, 5, 4, dtype=torch.int64), 8)
    assert got.tokens.shape == (0, 9) and got.num_nodes.shape == (0,)


# --- validation (no kernel launch) ----------------------------------------------------------


@pytest.mark.parametrize(
    "shape,budget,cap,match",
    [
        ((1, 15, 8), tb.MAX_BUDGET + 1, None, "budget"),
        ((1, 15, 8), -1, None, "budget"),
        ((1, tb.MAX_DEPTH + 1, 8), 16, None, "depth limit L"),
        ((1, 15, tb.MAX_TOP_K + 1), 16, None, "top_k_cap"),
        ((1, 15, 8), 16, 0, "top_k_cap"),
    ],
)
def test_limits_are_refused_with_the_parameter_named(shape, budget, cap, match):
    lp = torch.zeros(shape)
    with pytest.raises(ValueError, match=match):
        tb.build_tree_kernel(lp, torch.zeros(shape, dtype=torch.int64), budget, cap)


def test_limits_accepted_at_the_edge():
    cfg = tb.kernel_config(tb.MAX_DEPTH, 1000, tb.MAX_BUDGET, tb.MAX_TOP_K)  # K > 64 is fine with a cap
    assert cfg.block == 512 and cfg.words == 4 and cfg.budget == tb.MAX_BUDGET
    assert tb.kernel_config(15, 8, 64).as_dict() == dict(
        budget=64, block=64, words=1, bits=4, per_word=15, num_warps=tb.default_num_warps(64)
    )
    assert tb.kernel_config(15, 8, 100).block == 128
    assert tb.kernel_config(15, 8, 0).block == 1


def test_bad_shapes_and_out_are_refused():
    lp = torch.zeros(2, 4, 3)
    with pytest.raises(ValueError, match="one shape"):
        tb.build_tree_kernel(lp, torch.zeros(2, 4, 2, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="one shape"):
        tb.build_tree_kernel(lp[0], torch.zeros(4, 3, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="root_tokens"):
        tb.build_tree_kernel(lp, torch.zeros(2, 4, 3, dtype=torch.int64), 4, root_tokens=torch.zeros(3))
    out = tb.empty_tree_batch(2, 5, "cpu")  # budget 5, call with 4
    with pytest.raises(ValueError, match="out.tokens"):
        tb.build_tree_kernel(lp, torch.zeros(2, 4, 3, dtype=torch.int64), 4, out=out)
    with pytest.raises(ValueError, match="num_warps"):
        tb.kernel_config(4, 3, 4, num_warps=3)


def test_build_tree_dispatches_cpu_to_the_torch_builder(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the kernel must not run for CPU tensors")

    monkeypatch.setattr(tb, "build_tree_kernel", boom)
    gen = torch.Generator().manual_seed(14)
    lp, ids = make_inputs(gen, 3, 6, 5, "ties")
    roots = torch.tensor([1, 2, 3])
    got = tb.build_tree(lp, ids, 40, 4, roots)
    want = heap_batch(lp, ids, 40, 4, roots)
    assert got.equals(want), first_mismatch(got, want)
    # CPU has no kernel limits.
    assert tb.build_tree(torch.zeros(1, 2, 2), torch.zeros(1, 2, 2, dtype=torch.int64), 600).num_nodes.item() == 6


def test_lazy_package_exports():
    import sglang_overlay.kernels as k

    assert k.build_tree is tb.build_tree and k.MAX_BUDGET == 512
    with pytest.raises(AttributeError):
        k.nope  # noqa: B018
