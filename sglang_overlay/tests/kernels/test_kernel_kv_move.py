"""The accepted path's KV moved to its window's front (Triton, in the interpreter on CPU) against SGLang's semantics."""

from __future__ import annotations

import os

import pytest
import torch

from sglang_overlay.kernels import kv_move as km

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and km.kv_move_available()
needs_interpreter = pytest.mark.skipif(not INTERPRETED, reason="needs triton with TRITON_INTERPRET=1 (CPU)")

SLOTS, HEADS, DIM, W = 64, 2, 12, 6  # 48 bytes a slot in bf16: three 16-byte tiles


def pool(buffers: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(SLOTS, HEADS, DIM, generator=g).to(torch.bfloat16) for _ in range(buffers)]


def move(bufs: list, out_cache_loc, accept_index, accept_lens, max_path: int = 0) -> None:
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs], dtype=torch.int64)
    config = {"bytes_per_tile": 16, "byte_tiles": -(-int(strides[0]) // 16), "num_warps": 1}
    km.move_path_kv(ptrs, strides, out_cache_loc, accept_index, accept_lens, config, max_path=max_path)


def paths(rows_per_request: list) -> tuple:
    """accept_index ([bs, W], flat verify rows, -1 after the path) and accept_lens from window positions."""
    index = torch.full((len(rows_per_request), W), -1, dtype=torch.int64)
    for b, path in enumerate(rows_per_request):
        index[b, : len(path)] = torch.tensor([b * W + i for i in path])
    return index, torch.tensor([len(p) for p in rows_per_request], dtype=torch.int32)


# Window positions of each request's accepted path (root first). The windows' slots are scattered
# through the pool, as SGLang's allocator hands them out.
CASES = [
    ("root only", [[0], [0], [0]]),
    ("a chain in place", [[0, 1, 2], [0]]),
    ("a branch moves to the front", [[0, 3, 5], [0, 2]]),
    # node 1 comes from position 2, which node 2 overwrites: every read must come first
    ("a read from a slot the path overwrites", [[0, 2, 3, 4], [0, 1, 5]]),
    ("a whole window", [[0, 1, 2, 3, 4, 5], [0, 5]]),
]


@needs_interpreter
@pytest.mark.parametrize("bounded", [False, True], ids=["window rows", "longest path rows"])
@pytest.mark.parametrize("name,rows", CASES, ids=[c[0] for c in CASES])
def test_kernel_moves_each_path_as_sglang_does(name, rows, bounded):
    bs = len(rows)
    out_cache_loc = torch.randperm(SLOTS, generator=torch.Generator().manual_seed(bs))[: bs * W]
    accept_index, accept_lens = paths(rows)
    got, want = pool(4, 1), pool(4, 1)
    # bounded: the kernel holds only as many rows as the longest path (the drafter's block in the worker).
    move(got, out_cache_loc, accept_index, accept_lens, max_path=max(len(p) for p in rows) if bounded else 0)
    km.move_path_kv_torch(want, out_cache_loc, accept_index, accept_lens)
    for g, w in zip(got, want):
        assert torch.equal(g, w), name
    if name == "root only":  # nothing moved: the pool is as it was
        assert all(torch.equal(g, p) for g, p in zip(got, pool(4, 1)))


@needs_interpreter
def test_a_path_longer_than_max_path_is_not_moved_whole():
    """The bound is real: rows past ``max_path`` stay where they were (the worker passes the block,
    which no path exceeds)."""
    rows = [[0, 3, 5], [0]]
    out_cache_loc = torch.randperm(SLOTS, generator=torch.Generator().manual_seed(2))[: 2 * W]
    accept_index, accept_lens = paths(rows)
    got, want = pool(2, 3), pool(2, 3)
    move(got, out_cache_loc, accept_index, accept_lens, max_path=2)
    km.move_path_kv_torch(want, out_cache_loc, accept_index, accept_lens)
    assert not all(torch.equal(g, w) for g, w in zip(got, want))
