"""The Triton tree kernel on a CUDA GPU: exact equality with the heap oracle and the torch builder
over many shapes (ties, -inf, every key width, the limits), CUDA-graph capture and replay with new
inputs, no host synchronisation, the build_tree dispatch, and the AOT warm-up on the device.

Skipped without CUDA (and under TRITON_INTERPRET=1); run on a GPU host with
``TRITON_INTERPRET=0 python -m pytest tests/kernels``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from sglang_overlay.core.tree import build_tree_batched, draft_topk
from sglang_overlay.kernels import tree_build as tb

from .cases import first_mismatch, heap_batch, make_inputs

GPU = torch.cuda.is_available() and tb.triton_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
pytestmark = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU and TRITON_INTERPRET unset/0")


def _run_case(seed, batch, depth_limit, width, budget, cap, kind, num_warps=None, roots=True):
    gen = torch.Generator().manual_seed(seed)
    lp, ids = make_inputs(gen, batch, depth_limit, width, kind)
    root_tokens = torch.randint(0, 150_000, (batch,), generator=gen) if roots else None
    dev = lambda t: None if t is None else t.cuda()  # noqa: E731
    got = tb.build_tree_kernel(dev(lp), dev(ids), budget, cap, dev(root_tokens), num_warps=num_warps)
    want = heap_batch(lp, ids, budget, cap, root_tokens)
    assert got.device.type == "cuda"
    assert got.to("cpu").equals(want), first_mismatch(got, want)
    batched = build_tree_batched(dev(lp), dev(ids), budget, cap, dev(root_tokens))
    assert got.equals(batched), first_mismatch(got, batched)
    return got


@pytest.mark.parametrize(
    "seed,batch,depth_limit,width,budget,cap,kind",
    [
        (1, 64, 15, 8, 64, None, "random"),  # the service's shape
        (2, 64, 15, 8, 64, None, "ties"),
        (3, 7, 15, 8, 256, None, "ties"),
        (4, 5, 15, 32, 256, 8, "random"),  # top_k_cap < K
        (5, 3, 15, 32, 100, None, "ties"),  # W = 2, budget not a power of two
        (6, 4, 15, 16, 512, None, "random"),  # W = 2, the budget limit
        (7, 2, 32, 64, 512, None, "ties"),  # W = 4, every limit at once
        (8, 2, 32, 64, 300, None, "zeros"),  # W = 4, pure rank-tuple order
        (9, 4, 20, 64, 50, None, "zeros"),  # W = 3
        (10, 8, 3, 3, 40, None, "neginf"),  # -inf entries; budget > nodes that exist
        (11, 16, 1, 1, 5, None, "random"),  # L = 1, K = 1
        (12, 256, 15, 8, 16, None, "random"),
        (13, 3, 2, 2, 10, None, "random"),  # exhausts the tree: padding
        (14, 9, 15, 8, 1, None, "ties"),  # budget 1
        (15, 9, 15, 8, 0, None, "ties"),  # budget 0
        (16, 33, 15, 48, 128, 48, "ties"),  # W = 2 with bits 6
    ],
)
def test_gpu_kernel_equals_heap_and_batched(seed, batch, depth_limit, width, budget, cap, kind):
    _run_case(seed, batch, depth_limit, width, budget, cap, kind)


@pytest.mark.parametrize("num_warps", [1, 2, 4, 8])
def test_gpu_every_num_warps_gives_the_same_tree(num_warps):
    _run_case(20, 17, 15, 8, 256, None, "ties", num_warps=num_warps)
    _run_case(21, 17, 15, 8, 64, None, "random", num_warps=num_warps, roots=False)


def test_gpu_cuda_graph_capture_and_replay_with_new_inputs():
    batch, depth_limit, vocab, k, budget = 8, 15, 1000, 8, 64
    gen = torch.Generator(device="cuda").manual_seed(30)
    static_logits = torch.randn(batch, depth_limit, vocab, device="cuda", generator=gen)
    static_roots = torch.randint(0, vocab, (batch,), device="cuda", generator=gen)
    out = tb.empty_tree_batch(batch, budget, "cuda")

    def step():
        lp, ids = draft_topk(static_logits, k)
        tb.build_tree_kernel(lp, ids, budget, None, static_roots, out=out)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles) outside the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    for i in range(3):
        # New inputs, written into the captured buffers; coarse values give exact ties too.
        new_logits = torch.randn(batch, depth_limit, vocab, device="cuda", generator=gen)
        if i == 1:
            new_logits = new_logits.round()
        static_logits.copy_(new_logits)
        static_roots.copy_(torch.randint(0, vocab, (batch,), device="cuda", generator=gen))
        out.tokens.fill_(-1)
        out.num_nodes.fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        lp, ids = draft_topk(static_logits, k)
        want = heap_batch(lp, ids, budget, None, static_roots)
        assert out.to("cpu").equals(want), f"replay {i}: " + first_mismatch(out, want)


def test_gpu_no_host_sync():
    gen = torch.Generator().manual_seed(31)
    lp, ids = (t.cuda() for t in make_inputs(gen, 4, 15, 8, "random"))
    roots = torch.zeros(4, dtype=torch.int64, device="cuda")
    tb.build_tree_kernel(lp, ids, 64, None, roots)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tree = tb.build_tree_kernel(lp, ids, 64, None, roots)
        tree2 = tb.build_tree(lp, ids, 64, None, roots)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert tree.equals(tree2)


def test_gpu_build_tree_dispatch_and_limits():
    gen = torch.Generator().manual_seed(32)
    lp, ids = (t.cuda() for t in make_inputs(gen, 3, 15, 8, "ties"))
    got = tb.build_tree(lp, ids, 32)
    assert got.equals(build_tree_batched(lp, ids, 32))
    with pytest.raises(ValueError, match="budget"):
        tb.build_tree(lp, ids, tb.MAX_BUDGET + 1)


def _warmup(args, env_extra=None, timeout=300):
    env = dict(os.environ, TRITON_INTERPRET="0", **(env_extra or {}))
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_overlay.kernels.warmup", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc


def test_gpu_warmup_device_mode_and_cross_compiled_cache_is_hit(tmp_path):
    cache = tmp_path / "cache"
    common = ["--arch", "sm_90", "--cache-dir", str(cache), "--budgets", "16,64", "--top-k", "8,32"]
    cap = torch.cuda.get_device_capability()
    if cap != (9, 0):
        pytest.skip(f"written for sm_90, this GPU is {cap}")
    # 1. Cross-compile with the GPU hidden (what a GPU-less build host would do).
    proc = _warmup(
        [*common, "--cross-compile", "--manifest", str(tmp_path / "cross.json")], {"CUDA_VISIBLE_DEVICES": ""}
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 2. Device mode on the same cache, in a fresh process: every variant must already be there.
    proc = _warmup([*common, "--manifest", str(tmp_path / "device.json")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cross = json.loads((tmp_path / "cross.json").read_text())
    device = json.loads((tmp_path / "device.json").read_text())
    assert device["mode"] == "device" and device["arch"] == "sm_90" and device["device"]
    assert len(device["variants"]) == len(cross["variants"]) == 8
    assert [v["hash"] for v in device["variants"]] == [v["hash"] for v in cross["variants"]]
    assert all(v["was_cached"] and v["verified"] for v in device["variants"]), device["variants"]
    # A wrong --arch on this GPU is refused.
    proc = _warmup(["--arch", "sm_80", "--cache-dir", str(cache), "--budgets", "16"])
    assert proc.returncode == 2 and "sm_90" in proc.stderr
