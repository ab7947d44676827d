"""GPU check of the graphed tree stage: a script, not collected by pytest.

    python sglang_overlay/tests/adapter/gpu_stage_check.py      # on a CUDA host (torch, triton)

``tree_stage.GraphedTreeStage`` replaying its CUDA graphs (captured for 1, 2, 4, 8, 16, 32, 48; a batch is
padded up) must give the eager stage's layout bit for bit (tree, positions, ancestor masks, FULL-mask
scatter positions, links) at batch sizes 1, 3, 16 and 48,
over new inputs each call (drafter hidden states, roots and prefix lengths all change), with a
Qwen3-8B-shaped LM head (hidden 4096, vocabulary 151936, bf16), budget 15, top-k 8, window 16. A replay
that skipped the input copies (planted below) must be caught. Then wall time per call, eager vs graphed
(50 calls, synchronized at the end: host launch work and GPU time together). Also the one-launch
accepted path (``kernels.accept_path``) on CUDA == the torch ``accepted_step`` on CPU. And the stage
writing the FULL mask into a Triton-backend-like uint8 buffer (``mask_out``, ``kernels.full_mask``),
graphed, == the allocated mask at the same batch sizes, with the time of the mask part per step
(allocated: fill + scatter + the backend's copy; written: a view). And the DFlash2 lattice stage
(``lattice_tree_stage`` over a selector shaped like SGLang's: the head's top-16 per row, a rank-64
transition), graphed == eager at the same batch sizes, with its wall time per call beside the
marginal stage's. Prints JSON.
"""

import json
import os
import sys
import time

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, "..", "..", "src")]
from sglang_overlay.adapter.settings import ResolvedDDTree  # noqa: E402
from sglang_overlay.adapter.tree_stage import GraphedTreeStage, layout_rows  # noqa: E402
from sglang_overlay.adapter.tree_step import lattice_tree_stage, tree_stage  # noqa: E402
from sglang_overlay.adapter.tree_verify import (  # noqa: E402
    accepted_step,
    dense_head_topk,
    verify_tensors_from_layout,
)
from sglang_overlay.kernels.accept_path import accept_path  # noqa: E402

FIELDS = ("positions", "ancestors", "mask_index", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling")
HIDDEN, VOCAB, DEV = 4096, 151936, "cuda"
SIZES = [1, 2, 4, 8, 16, 32, 48]


def same_layout(a, b):
    return a.tree.equals(b.tree) and all(torch.equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


def stage_inputs(bs, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    hidden = torch.randn(bs, 16, HIDDEN, device=DEV, dtype=torch.bfloat16, generator=g)
    roots = torch.randint(0, VOCAB, (bs,), device=DEV, generator=g)
    prefix = torch.randint(0, 3000, (bs,), device=DEV, generator=g)
    return hidden, roots, prefix


def wall(fn, args, reps=50):
    fn(*args)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn(*args)
    torch.cuda.synchronize()
    return round((time.perf_counter() - t) * 1e3 / reps, 3)


def main():
    weight = (
        torch.randn(VOCAB, HIDDEN, device=DEV, dtype=torch.bfloat16, generator=torch.Generator(DEV).manual_seed(0))
        * 0.02
    )
    settings = ResolvedDDTree(budget=15, top_k=8, allow_hybrid_unsafe=False, window=16)
    eager = tree_stage(lambda rows, k: dense_head_topk(rows, weight, k), settings)
    graphed = GraphedTreeStage(eager, batch_sizes=SIZES)
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "wall_per_call_ms": []}
    with torch.inference_mode():
        for bs in (1, 3, 16, 48):
            for step in range(4):
                args = stage_inputs(bs, 100 * bs + step)
                assert same_layout(eager(*args), graphed(*args)), ("graphed stage differs", bs, step)
            entry = graphed._graphs[min(s for s in SIZES if s >= bs)]
            entry.replay()  # planted: a replay without copying the new inputs in
            assert not same_layout(eager(*stage_inputs(bs, 999)), layout_rows(entry.out, bs)), ("stale replay", bs)
            out["wall_per_call_ms"].append({"bs": bs, "eager": wall(eager, args), "graphed": wall(graphed, args)})
    out["checked"] = {
        "batch_sizes": [1, 3, 16, 48],
        "calls_each": 4,
        "captured": graphed.captured_sizes,
        "planted_stale_replay_caught": True,
    }
    for seed in range(20):  # eagle_sample-like outputs: root row, accepted rows, then -1
        g = torch.Generator().manual_seed(seed)
        bs, width = 1 + seed * 3, 16
        predict = torch.randint(0, VOCAB, (bs * width,), generator=g, dtype=torch.int32)
        lens = torch.randint(1, width + 1, (bs,), generator=g, dtype=torch.int32)
        index = torch.full((bs, width), -1, dtype=torch.int32)
        for b in range(bs):
            slots = torch.randperm(width - 1, generator=g)[: int(lens[b]) - 1] + 1
            index[b, : int(lens[b])] = b * width + torch.cat([torch.zeros(1, dtype=torch.long), slots]).int()
        prefix = torch.randint(0, 5000, (bs,), generator=g)
        want = accepted_step(predict, index, lens, prefix)
        got = accept_path(predict.cuda(), index.cuda(), lens.cuda(), prefix.cuda())
        for a, b in zip(got, (want.out_tokens, want.accept_lens, want.bonus, want.path_rows, want.path_positions)):
            assert torch.equal(a.cpu(), b), ("accept_path differs", seed)
    out["accept_path_equal_cases"] = 20
    # The FULL mask written by the graphed stage into a buffer shaped like the Triton backend's
    # (uint8, max batch x W x (context + W)); the copy the backend makes at replay is onto itself.
    buffer = torch.zeros(48 * 16 * (3000 + 16), dtype=torch.uint8, device=DEV)
    head = lambda rows, k: dense_head_topk(rows, weight, k)  # noqa: E731
    written = GraphedTreeStage(tree_stage(head, settings, mask_out=buffer), batch_sizes=SIZES)
    out["mask_ms"] = []
    with torch.inference_mode():
        for bs in (1, 3, 16, 48):
            for step in range(4):
                hidden, roots, prefix = stage_inputs(bs, 500 * bs + step)
                want = verify_tensors_from_layout(eager(hidden, roots, prefix), prefix, prefix.cpu()).custom_mask
                got = verify_tensors_from_layout(written(hidden, roots, prefix), prefix, prefix.cpu()).custom_mask
                assert got.data_ptr() == buffer.data_ptr() and torch.equal(got.bool(), want), ("mask differs", bs, step)
            layout, layout_w = graphed(hidden, roots, prefix), written(hidden, roots, prefix)
            cpu = prefix.cpu()

            def allocated():
                m = verify_tensors_from_layout(layout, prefix, cpu).custom_mask
                buffer[: m.shape[0]] = m  # the backend's copy into its graph buffer

            def in_place():
                m = verify_tensors_from_layout(layout_w, prefix, cpu).custom_mask
                buffer[: m.shape[0]] = m  # a copy onto itself: torch skips it

            out["mask_ms"].append({"bs": bs, "allocated": wall(allocated, ()), "written": wall(in_place, ())})
    out["mask_written_equal"] = {"batch_sizes": [1, 3, 16, 48], "calls_each": 4}
    out["lattice"] = lattice_check(weight, settings, graphed)
    print(json.dumps(out, indent=1))


def lattice_check(weight, settings, marginal, width=16, rank=64):
    """The lattice stage graphed == eager, and its time per call beside the graphed marginal stage's."""
    g = torch.Generator(DEV).manual_seed(3)
    pred = torch.randn(VOCAB, rank, device=DEV, generator=g) * 0.1
    succ = torch.randn(VOCAB, rank, device=DEV, generator=g) * 0.1
    proj = torch.randn(HIDDEN, rank, device=DEV, dtype=torch.bfloat16, generator=g) * 0.02

    def lattice(hidden_rows, roots):  # SGLang's _selector_lattice, restated for a synthetic selector
        unary, ids = (hidden_rows @ weight.T).float().topk(width, dim=-1)
        before = torch.cat([roots.view(-1, 1, 1).expand(-1, 1, width), ids[:, :-1]], dim=1)
        h = (hidden_rows @ proj).float()
        return ids, unary[:, :, None] + torch.einsum("blpr,blcr->blpc", pred[before] * h[:, :, None], succ[ids])

    eager = lattice_tree_stage(lattice, settings)
    graphed = GraphedTreeStage(eager, batch_sizes=SIZES)
    result = {"width": width, "rank": rank, "wall_per_call_ms": []}
    with torch.inference_mode():
        for bs in (1, 3, 16, 48):
            for step in range(4):
                args = stage_inputs(bs, 700 * bs + step)
                assert same_layout(eager(*args), graphed(*args)), ("graphed lattice stage differs", bs, step)
            result["wall_per_call_ms"].append(
                {
                    "bs": bs,
                    "lattice_eager": wall(eager, args),
                    "lattice_graphed": wall(graphed, args),
                    "marginal_graphed": wall(marginal, args),
                }
            )
    result["captured"] = graphed.captured_sizes
    return result


if __name__ == "__main__":
    main()
