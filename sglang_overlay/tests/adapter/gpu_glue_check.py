"""GPU check of the DDTree adapter's tensor glue: a script, not collected by pytest.

    python sglang_overlay/tests/adapter/gpu_glue_check.py      # on a CUDA host

Needs torch with CUDA, triton, and the sglang 0.5.23 *files* (e.g. ``pip install --no-deps
--target DIR sglang==0.5.23`` and ``PYTHONPATH=DIR``; nothing of SGLang is imported: its Triton
verify kernels are extracted from the sources, as tests/core/_sglang_kernels.py does). Checks: the
verify tensors on CUDA equal the CPU ones; SGLang's compiled ``reconstruct_indices_from_tree_mask``
and ``verify_tree_greedy`` agree with them and with the core's walk; the toy end-to-end step
(test_tree_step.py) reproduces greedy decoding on CUDA. Then times the per-step glue at realistic
sizes. ``DEV=cpu TRITON_INTERPRET=1 SKIP_TIMINGS=1`` runs the checks on CPU. Prints JSON.
"""

import json
import os
import statistics
import sys

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, "..", "..", "src"), os.path.join(_HERE, "..")]
from core._sglang_kernels import _extract_from_source  # noqa: E402

from sglang_overlay.adapter.settings import ResolvedDDTree  # noqa: E402
from sglang_overlay.adapter.tree_step import run_tree_step  # noqa: E402
from sglang_overlay.adapter.tree_verify import (  # noqa: E402
    accepted_step,
    build_tree_verify_tensors,
    dense_head_topk,
)
from sglang_overlay.core.tree import draft_topk  # noqa: E402
from sglang_overlay.core.verify import ancestor_mask  # noqa: E402
from sglang_overlay.core.walk import walk_tree  # noqa: E402

out = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "torch": torch.__version__}
K = _extract_from_source()
dev = os.environ.get("DEV", "cuda")


def rand_draft(bs, depth, k, vocab, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(bs, depth, vocab, generator=g, device=device) * 3
    return draft_topk(logits, k)


# 1+2+3: GPU == CPU, SGLang's compiled kernels == our links / the core walk
checks = 0
for seed in range(20):
    bs, depth, k, window, vocab = 6, 15, 4, 16, 50
    budget = [15, 7, 1, 11][seed % 4]
    lp, ids = rand_draft(bs, depth, k, vocab, seed, "cpu")
    prefix = torch.randint(0, 300, (bs,), generator=torch.Generator().manual_seed(seed))
    roots = torch.arange(bs) + 3
    cpu = build_tree_verify_tensors(lp, ids, roots, prefix, budget, k, window)
    gpu = build_tree_verify_tensors(
        lp.to(dev), ids.to(dev), roots.to(dev), prefix.to(dev), budget, k, window, prefix_lens_cpu=prefix
    )
    for f in (
        "draft_token",
        "positions",
        "custom_mask",
        "retrieve_index",
        "retrieve_next_token",
        "retrieve_next_sibling",
    ):
        assert torch.equal(getattr(cpu, f), getattr(gpu, f).cpu()), (seed, f)
    assert gpu.tree.equals(cpu.tree.to(dev)), seed
    qlen = ancestor_mask(gpu.tree).reshape(-1).contiguous()
    pos = torch.empty(bs * window, dtype=torch.int64, device=dev)
    ri, rn, rs = (torch.empty(bs, window, dtype=torch.int64, device=dev) for _ in range(3))
    K.reconstruct_indices_from_tree_mask(qlen, prefix.to(dev), pos, ri, rn, rs, bs, window)
    assert torch.equal(pos, gpu.positions) and torch.equal(ri, gpu.retrieve_index)
    assert torch.equal(rn, gpu.retrieve_next_token) and torch.equal(rs, gpu.retrieve_next_sibling)
    # target tokens: follow a child 80% of the time
    g = torch.Generator().manual_seed(1000 + seed)
    target = torch.randint(0, vocab, (bs, window), generator=g)
    t = cpu.tree
    for b in range(bs):
        for s in range(window):
            ch = [c for c in range(window) if int(t.parents[b, c]) == s and c <= int(t.num_nodes[b])]
            if ch and float(torch.rand((), generator=g)) < 0.8:
                target[b, s] = t.tokens[b, ch[0]]
    target = target.to(dev)
    predict = torch.zeros(bs * window, dtype=torch.int32, device=dev)
    aidx = torch.full((bs, window), -1, dtype=torch.int32, device=dev)
    ncor = torch.empty(bs, dtype=torch.int32, device=dev)
    K.verify_tree_greedy(
        predict,
        aidx,
        ncor,
        gpu.draft_token.view(bs, window),
        gpu.retrieve_index,
        gpu.retrieve_next_token,
        gpu.retrieve_next_sibling,
        target,
    )
    walk = walk_tree(gpu.tree, target, max_depth=window - 1)
    assert torch.equal(ncor.long(), walk.accept_len), seed
    step = accepted_step(predict, aidx, ncor + 1, prefix.to(dev))
    assert torch.equal(step.bonus, walk.bonus), seed
    for b in range(bs):
        n = int(step.accept_lens[b])
        assert step.out_tokens[b, :n].tolist() == walk.emitted_tokens[b, :n].tolist()
    checks += 1
out["gpu_equals_cpu_and_sglang_kernels_agree_batches"] = checks

# 4: the toy end-to-end step on CUDA (ports' toy models run on CPU rows; tensors on GPU)
from adapter.test_tree_step import ToyPorts, ToyTarget  # noqa: E402


class CudaToyPorts(ToyPorts):
    def draft_hidden(self, root_tokens, prefix_lens):
        return super().draft_hidden(root_tokens.cpu(), prefix_lens.cpu()).to(dev)

    def verify(self, t):
        class T:  # CPU view of the tensors for the toy target
            pass

        c = T()
        for f in ("draft_token", "positions", "custom_mask"):
            setattr(c, f, getattr(t, f).cpu())
        return super().verify(c).to(dev)

    def commit(self, t, logits, step):
        class S:
            pass

        s = S()
        for f in ("out_tokens", "accept_lens", "bonus", "path_rows", "path_positions"):
            setattr(s, f, getattr(step, f).cpu())

        class T:
            pass

        c = T()
        c.draft_token = t.draft_token.cpu()
        super().commit(c, logits, s)
        self.roots = step.bonus


target = ToyTarget(seed=7)
prompts = [[1, 2, 3], [5], [7, 7, 7, 7, 2], [9, 1]]
ports = CudaToyPorts(target, prompts, 16, 0.6, K, seed=3)
settings = ResolvedDDTree(budget=15, top_k=4, allow_hybrid_unsafe=False, window=16)
ports.roots = ports.roots.to(dev)
steps = 0
while min(len(e) for e in ports.emitted) < 40:
    prefix = torch.tensor([len(c) for c in ports.committed])
    run_tree_step(ports, settings, ports.roots, prefix.to(dev), prefix_lens_cpu=prefix)
    steps += 1
for p, e in zip(prompts, ports.emitted):
    assert e[:40] == target.greedy(p, 40)
out["toy_end_to_end"] = {"tokens_per_request": 40, "steps": steps}


# 5: timings of the per-step glue on the GPU (CUDA events; median of 20 after 5 warm-ups)
def timed(fn, reps=20, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return round(statistics.median(times), 3)


timings = []
hidden_size, vocab = 4096, 151936
if os.environ.get("SKIP_TIMINGS"):
    print(json.dumps(out, indent=1))
    sys.exit(0)
weight = torch.randn(vocab, hidden_size, device=dev, dtype=torch.bfloat16) * 0.02
for bs in (1, 16, 48):
    for budget, k in ((15, 8), (7, 4)):
        window, depth, prefix_len = 16, 15, 2048
        hidden = torch.randn(bs * depth, hidden_size, device=dev, dtype=torch.bfloat16)
        prefix = torch.full((bs,), prefix_len, device=dev)
        prefix_cpu = torch.full((bs,), prefix_len)
        roots = torch.zeros(bs, dtype=torch.int64, device=dev)
        lp, ids = dense_head_topk(hidden, weight, k)
        lp, ids = lp.view(bs, depth, -1), ids.view(bs, depth, -1)
        head_ms = timed(lambda: dense_head_topk(hidden, weight, k))
        build_ms = timed(lambda: build_tree_verify_tensors(lp, ids, roots, prefix, budget, k, window, prefix_cpu))
        timings.append(
            {
                "bs": bs,
                "budget": budget,
                "top_k": k,
                "prefix_len": prefix_len,
                "head_topk_ms": head_ms,
                "tree_and_verify_tensors_ms": build_ms,
            }
        )
out["timings_per_step"] = timings

# 6: where the time goes (bs 1 and 48, budget 15, top-k 8)
from sglang_overlay.adapter.tree_verify import full_custom_mask, pad_tree  # noqa: E402
from sglang_overlay.core.tree import build_tree_batched  # noqa: E402
from sglang_overlay.core.verify import eagle_verify_links, verify_positions  # noqa: E402

breakdown = []
for bs in (1, 48):
    hidden = torch.randn(bs * 15, hidden_size, device=dev, dtype=torch.bfloat16)
    logits = hidden @ weight.T
    lp, ids = draft_topk(logits, 8)
    lp, ids = lp.view(bs, 15, 8), ids.view(bs, 15, 8)
    tree16 = pad_tree(build_tree_batched(lp, ids, 15), 16)
    anc = ancestor_mask(tree16)
    prefix = torch.full((bs,), 2048, device=dev)
    prefix_cpu = torch.full((bs,), 2048)
    breakdown.append(
        {
            "bs": bs,
            "lm_head_matmul_ms": timed(lambda: hidden @ weight.T),
            "draft_topk_stable_ms": timed(lambda: draft_topk(logits, 8)),
            "draft_topk_torch_topk_ms": timed(lambda: draft_topk(logits, 8, stable=False)),
            "build_tree_batched_b15_ms": timed(lambda: build_tree_batched(lp, ids, 15)),
            "build_tree_batched_b7_ms": timed(lambda: build_tree_batched(lp, ids, 7)),
            "ancestor_mask_ms": timed(lambda: ancestor_mask(tree16)),
            "eagle_verify_links_ms": timed(lambda: eagle_verify_links(tree16)),
            "full_custom_mask_ms": timed(lambda: full_custom_mask(anc, prefix, prefix_cpu)),
            "verify_positions_ms": timed(lambda: verify_positions(tree16, prefix)),
        }
    )
out["breakdown"] = breakdown
print(json.dumps(out, indent=1))
