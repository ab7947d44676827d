"""The FULL tree-verify mask written in place (Triton, in the interpreter on CPU) against ``full_custom_mask``."""

from __future__ import annotations

import os

import pytest
import torch

from sglang_overlay.adapter.tree_verify import full_custom_mask, write_full_mask_torch
from sglang_overlay.kernels import full_mask as fm

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and fm.full_mask_available()
needs_interpreter = pytest.mark.skipif(not INTERPRETED, reason="needs triton with TRITON_INTERPRET=1 (CPU)")


def ancestors(bs: int, width: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(bs, width, width, generator=g) < 0.4


# prefix 0 (the tree block only), short rows, and a row longer than one BLOCK of columns (two passes).
CASES = [(3, 8, [0, 5, 17], 0), (1, 16, [fm.BLOCK + 40], 1), (4, 1, [2, 0, 9, 1], 2)]


@needs_interpreter
@pytest.mark.parametrize("bs,width,prefix,seed", CASES)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bool])
def test_kernel_writes_sglangs_full_mask_and_nothing_after_it(bs, width, prefix, seed, dtype):
    anc, prefix = ancestors(bs, width, seed), torch.tensor(prefix)
    want = full_custom_mask(anc, prefix)
    out = torch.full((want.numel() + 37,), 7, dtype=torch.uint8)
    target = out.view(torch.bool)[: want.numel()] if dtype == torch.bool else out
    if dtype == torch.bool:
        target.zero_()
    fm.write_full_mask(target, anc, prefix)
    assert torch.equal(out[: want.numel()].bool(), want)
    assert out[: want.numel()].max() <= 1  # 0/1 bytes, as the attention kernel reads them
    assert torch.all(out[want.numel() :] == 7)


@needs_interpreter
def test_kernel_drops_writes_past_the_buffer():
    anc, prefix = ancestors(3, 8, seed=3), torch.tensor([4, 30, 2])
    want = full_custom_mask(anc, prefix)
    backing = torch.full((want.numel(),), 7, dtype=torch.uint8)
    short = backing[: want.numel() - 50]
    fm.write_full_mask(short, anc, prefix)
    assert torch.equal(short.bool(), want[: short.numel()])
    assert torch.all(backing[short.numel() :] == 7)


def test_torch_fallback_writes_the_same_mask():
    anc, prefix = ancestors(3, 8, seed=4), torch.tensor([0, 12, 3])
    want = full_custom_mask(anc, prefix)
    out = torch.zeros(want.numel() + 5, dtype=torch.uint8)
    write_full_mask_torch(out, anc, prefix)
    assert torch.equal(out[: want.numel()].bool(), want)
    assert torch.equal(fm.request_starts(prefix, 8), torch.tensor([0, 8 * 8, 8 * 8 + 8 * 20]))
