"""DDTree tree-build benchmark: the Triton kernel vs the torch batched builder vs a per-request CPU heap.

    PYTHONPATH=sglang_overlay/src python3 sglang_overlay/benchmarks/tree_build.py [--out bench.txt]

Needs a CUDA GPU. One run prints, as markdown tables:

1. per (batch, budget): ``draft_topk`` time (stable sort and ``torch.topk``; from logits of the
   vocabulary size, shared by every builder and measured separately), then the tree build alone:
   the kernel, ``build_tree_batched`` on the GPU, and the per-request CPU heap (the reference's
   way: device->host copy of the top-k, then ``build_tree_heap`` per request on Python lists),
   with the ratios heap/kernel and batched/kernel, and the correctness check (kernel == heap for
   every request, kernel == batched);
2. the effect of K and ``top_k_cap`` at batch 64;
3. warps per program (the kernel's one tuning knob);
4. ``draft_topk`` + kernel captured in one CUDA graph, and the kernel's eager wall time per call
   (Python wrapper and launch included).

Timing. Kernel, two numbers: "GPU" = one CUDA graph of 20 back-to-back launches replayed under
``triton.testing.do_bench`` (CUDA events, warm-up, median, L2 flushed between replays), divided by
20 -- the device time of one launch, as inside a graph-captured decode step; "eager" = host wall
time per call over 200 plain calls, then one synchronisation (Python wrapper, allocation of the
outputs and Triton's launch included; the GPU work overlaps). The ratios use the eager time, the
more conservative one. ``draft_topk`` and ``build_tree_batched``: ``do_bench`` medians (the
batched builder is bound by its ~30 launches per pop step). CPU heap: ``time.perf_counter``
medians, host-synchronised first, device->host copy of the top-k and ``tolist`` included (the
copy of the finished tree back to the GPU is not).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import subprocess
import sys
import time

import torch


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


class Printer:
    def __init__(self, path: str | None):
        self.f = open(path, "w") if path else None

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        if self.f:
            self.f.write(line + "\n")
            self.f.flush()


def _driver_version() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001
        return "unknown"


def _ratio(a: float, b: float) -> str:
    r = a / b
    return f"{r:.1f}x" if r < 10 else f"{r:.0f}x"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=_ints, default=[1, 8, 64, 256])
    ap.add_argument("--budgets", type=_ints, default=[16, 64, 256])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--block", type=int, default=16, help="block size; L = block - 1 draft positions")
    ap.add_argument("--top-k", type=int, default=8, help="K of draft_topk for the main table")
    ap.add_argument("--heap-repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-extra", action="store_true", help="only the main table")
    ap.add_argument("--out", help="also write the output to this file")
    ap.add_argument(
        "--device",
        default="cuda",
        help="cuda (default); 'cpu' only smoke-tests this script (kernel in TRITON_INTERPRET=1, "
        "wall-clock timing, no graphs)",
    )
    ns = ap.parse_args(argv)

    smoke = ns.device == "cpu"
    if not smoke and not torch.cuda.is_available():
        print("tree_build benchmark: needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    if smoke:

        def do_bench(fn, warmup=0, rep=0, return_mode="median"):
            fn()
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(times)

        torch.cuda.synchronize = lambda *a, **k: None
    else:
        from triton.testing import do_bench

    from sglang_overlay.core.heap import build_tree_heap
    from sglang_overlay.core.tree import build_tree_batched, draft_topk, heap_trees_to_batch
    from sglang_overlay.kernels.tree_build import (
        build_tree_kernel,
        default_num_warps,
        empty_tree_batch,
        kernel_config,
    )

    out = Printer(ns.out)
    dev = torch.device(ns.device)
    L = ns.block - 1
    V = ns.vocab
    out(f"# DDTree tree-build benchmark ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC})")
    if smoke:
        gpu = "none (CPU smoke test: the numbers mean nothing)"
    else:
        props = torch.cuda.get_device_properties(dev)
        gpu = (
            f"{props.name} ({props.multi_processor_count} SMs, sm_{props.major}{props.minor}), driver "
            f"{_driver_version()}"
        )
    out(
        f"GPU {gpu}, torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, "
        f"Python {platform.python_version()}, host CPU {platform.processor() or platform.machine()}"
    )
    out(f"L = {L} (block {ns.block}), vocabulary {V}, K = {ns.top_k} (main table), bf16 logits ~ N(0, 3^2)")
    out()

    def bench_ms(fn, rep=200):
        return do_bench(fn, warmup=25, rep=rep, return_mode="median")

    def capture(fn, n=1):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n):
                fn()
        return g

    def kernel_ms(lp, ids, budget, cap, roots, num_warps=None, n=20):
        """(GPU ms per launch from a graph of n launches, eager wall ms per call)."""
        res = empty_tree_batch(lp.shape[0], budget, dev)

        def fn():
            return build_tree_kernel(lp, ids, budget, cap, roots, out=res, num_warps=num_warps)

        if smoke:
            return bench_ms(fn), bench_ms(fn)
        g = capture(fn, n)
        t_gpu = bench_ms(g.replay) / n
        del g

        def fn2():
            return build_tree_kernel(lp, ids, budget, cap, roots, num_warps=num_warps)

        fn2()
        torch.cuda.synchronize()
        reps = 200
        t0 = time.perf_counter()
        for _ in range(reps):
            fn2()
        torch.cuda.synchronize()
        return t_gpu, (time.perf_counter() - t0) * 1e3 / reps

    def heap_ms(lp, ids, budget, cap, repeats):
        times, trees = [], None
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            lp_l = lp.cpu().tolist()  # device -> host copy of the top-k, as the reference does
            ids_l = ids.cpu().tolist()
            trees = [build_tree_heap(lp_l[b], ids_l[b], budget, cap) for b in range(len(lp_l))]
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times), trees

    def check(kernel_tree, trees, budget, roots, batched_tree):
        want = heap_trees_to_batch(trees, budget, roots.cpu())
        got = kernel_tree.to("cpu")
        ok = sum(int(got.request(b) == want.request(b)) for b in range(want.batch_size))
        exact = got.equals(want) and kernel_tree.equals(batched_tree)
        return ok, exact

    gen = torch.Generator(device=dev).manual_seed(ns.seed)
    all_ok = True

    # ---- 1. main table --------------------------------------------------------------------------
    out("## 1. Per step, K = %d, top_k_cap none (times in ms; ratios = other / kernel)" % ns.top_k)
    out()
    out(
        "| batch | budget | topk stable | topk fast | kernel GPU | kernel eager | batched (GPU) | heap (CPU) "
        "| heap/kernel | batched/kernel | heap per request | kernel == heap |"
    )
    out("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    inputs = {}
    for batch in ns.batches:
        logits = (torch.randn(batch, L, V, device=dev, generator=gen) * 3).to(torch.bfloat16)
        roots = torch.randint(0, V, (batch,), device=dev, generator=gen)
        t_topk = bench_ms(lambda: draft_topk(logits, ns.top_k, stable=True))
        t_fast = bench_ms(lambda: draft_topk(logits, ns.top_k, stable=False))
        lp, ids = draft_topk(logits, ns.top_k)
        inputs[batch] = (lp, ids, roots)
        del logits
        for budget in ns.budgets:
            tree = build_tree_kernel(lp, ids, budget, None, roots)
            t_gpu, t_kernel = kernel_ms(lp, ids, budget, None, roots)
            batched = build_tree_batched(lp, ids, budget, None, roots)
            t_batched = bench_ms(lambda: build_tree_batched(lp, ids, budget, None, roots), rep=100)
            t_heap, trees = heap_ms(lp, ids, budget, None, ns.heap_repeats)
            ok, exact = check(tree, trees, budget, roots, batched)
            all_ok &= exact
            out(
                f"| {batch} | {budget} | {t_topk:.3f} | {t_fast:.3f} | {t_gpu:.4f} | {t_kernel:.4f} | "
                f"{t_batched:.2f} | "
                f"{t_heap:.2f} | {_ratio(t_heap, t_kernel)} | {_ratio(t_batched, t_kernel)} | "
                f"{t_heap / batch:.3f} | {ok}/{batch}{'' if exact else ' MISMATCH'} |"
            )
        torch.cuda.empty_cache()
    out()

    if smoke:
        torch.cuda.empty_cache = lambda: None
    if not ns.skip_extra:
        # ---- 2. K and top_k_cap at batch 64 -------------------------------------------------------
        batch = 64 if 64 in ns.batches else ns.batches[-1]
        out(f"## 2. K and top_k_cap, batch {batch} (ms)")
        out()
        out(
            "| K | top_k_cap | budget | key words W | kernel GPU | kernel eager | heap (CPU) | heap/kernel "
            "| kernel == heap |"
        )
        out("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        logits = (torch.randn(batch, L, V, device=dev, generator=gen) * 3).to(torch.bfloat16)
        roots = torch.randint(0, V, (batch,), device=dev, generator=gen)
        for k, cap in ((8, None), (32, None), (32, 8), (64, None), (64, 16)):
            lp, ids = draft_topk(logits, k)
            for budget in ns.budgets:
                w = kernel_config(L, k, budget, cap).words
                tree = build_tree_kernel(lp, ids, budget, cap, roots)
                t_gpu, t_kernel = kernel_ms(lp, ids, budget, cap, roots)
                t_heap, trees = heap_ms(lp, ids, budget, cap, ns.heap_repeats)
                batched = build_tree_batched(lp, ids, budget, cap, roots)
                ok, exact = check(tree, trees, budget, roots, batched)
                all_ok &= exact
                out(
                    f"| {k} | {cap if cap else 'none'} | {budget} | {w} | {t_gpu:.4f} | {t_kernel:.4f} | "
                    f"{t_heap:.2f} | "
                    f"{_ratio(t_heap, t_kernel)} | {ok}/{batch}{'' if exact else ' MISMATCH'} |"
                )
        del logits
        out()

        # ---- 3. warps per program -------------------------------------------------------------------
        out(f"## 3. Warps per program (kernel GPU ms per launch, K = {ns.top_k}; * = default)")
        out()
        warps = (1, 2, 4, 8)
        out("| batch | budget | " + " | ".join(f"{w} warp{'s' if w > 1 else ''}" for w in warps) + " |")
        out("| ---: | ---: | " + " | ".join("---:" for _ in warps) + " |")
        for batch in [b for b in (64, 256) if b in inputs]:
            lp, ids, roots = inputs[batch]
            for budget in ns.budgets:
                cells = []
                ref = build_tree_kernel(lp, ids, budget, None, roots)
                for w in warps:
                    got = build_tree_kernel(lp, ids, budget, None, roots, num_warps=w)
                    all_ok &= got.equals(ref)
                    t = kernel_ms(lp, ids, budget, None, roots, num_warps=w)[0]
                    star = "*" if w == default_num_warps(kernel_config(L, ns.top_k, budget).block) else ""
                    cells.append(f"{t:.4f}{star}")
                out(f"| {batch} | {budget} | " + " | ".join(cells) + " |")
        out()

        if smoke:
            out("(section 4, CUDA graphs, skipped on CPU)")

    # ---- 4. top-k + tree in one CUDA graph ---------------------------------------------------------
    if not ns.skip_extra and not smoke:
        out("## 4. The drafting half of a step in one CUDA graph: draft_topk + kernel, one replay (ms)")
        out()
        out("| batch | budget | stable top-k + kernel | torch.topk + kernel |")
        out("| ---: | ---: | ---: | ---: |")
        for batch in [b for b in (1, 64, 256) if b in inputs]:
            logits = (torch.randn(batch, L, V, device=dev, generator=gen) * 3).to(torch.bfloat16)
            roots = torch.randint(0, V, (batch,), device=dev, generator=gen)
            for budget in ns.budgets:
                res = empty_tree_batch(batch, budget, dev)
                cells = []
                for stable in (True, False):

                    def step(stable=stable):
                        lp, ids = draft_topk(logits, ns.top_k, stable=stable)
                        build_tree_kernel(lp, ids, budget, None, roots, out=res)

                    g = capture(step)
                    cells.append(bench_ms(g.replay))
                    del g
                out(f"| {batch} | {budget} | {cells[0]:.3f} | {cells[1]:.3f} |")
            del logits
            torch.cuda.empty_cache()
        out()

    out(f"correctness: {'every kernel tree equals the heap oracle and the batched builder' if all_ok else 'MISMATCH'}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
