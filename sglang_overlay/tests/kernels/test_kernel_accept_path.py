"""The one-launch accepted path (Triton, in the interpreter on CPU) against the torch ``accepted_step``."""

from __future__ import annotations

import os

import pytest
import torch

from sglang_overlay.adapter.tree_verify import accepted_step
from sglang_overlay.kernels import accept_path as ap

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and ap.accept_path_available()
pytestmark = pytest.mark.skipif(not INTERPRETED, reason="needs triton with TRITON_INTERPRET=1 (CPU)")


def sglang_like_outputs(bs: int, width: int, seed: int):
    """What eagle_sample returns: per request the root's row, then accepted rows (any slots), then -1."""
    g = torch.Generator().manual_seed(seed)
    predict = torch.randint(0, 150_000, (bs * width,), generator=g, dtype=torch.int32)
    lens = torch.randint(1, width + 1, (bs,), generator=g, dtype=torch.int32)
    lens[0], lens[-1] = 1, width  # the bonus alone; every slot accepted
    index = torch.full((bs, width), -1, dtype=torch.int32)
    for b in range(bs):
        slots = torch.randperm(width - 1, generator=g)[: int(lens[b]) - 1] + 1
        index[b, : int(lens[b])] = b * width + torch.cat([torch.zeros(1, dtype=torch.long), slots]).int()
    prefix = torch.randint(0, 5000, (bs,), generator=g)
    return predict, index, lens, prefix


@pytest.mark.parametrize("bs,width,seed", [(5, 16, 0), (3, 6, 1), (1, 1, 2), (8, 9, 3)])
def test_accept_path_equals_the_torch_accepted_step(bs, width, seed):
    predict, index, lens, prefix = sglang_like_outputs(bs, width, seed)
    want = accepted_step(predict, index, lens, prefix)  # CPU tensors: the torch ops
    out_tokens, got_lens, bonus, path_rows, path_positions = ap.accept_path(predict, index, lens, prefix)
    assert torch.equal(out_tokens, want.out_tokens)
    assert torch.equal(got_lens, want.accept_lens) and got_lens.dtype == torch.int32
    assert torch.equal(bonus, want.bonus)
    assert torch.equal(path_rows, want.path_rows)
    assert torch.equal(path_positions, want.path_positions)
