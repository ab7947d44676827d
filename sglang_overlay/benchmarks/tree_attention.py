"""Tree-verify attention benchmark: ``kernels.tree_attention`` vs SGLang 0.5.23's Triton extend kernel.

    PYTHONPATH=sglang_overlay/src python3 sglang_overlay/benchmarks/tree_attention.py [--json out.json]

Needs a CUDA GPU and SGLang importable. One layer of a Qwen3-8B-shaped target's verify (32 query
heads, 8 KV heads, head dim 128, bf16; window 16; prefixes drawn from --prefix LO,HI) at each batch
size, timed in the same run:

* ``sglang causal``: SGLang's ``extend_attention_fwd`` without a mask (DFLASH's verify),
* ``sglang mask``: the same with the FULL tree mask (DDTREE's verify before this kernel),
* ``tree ROWS,BLOCK_N,WARPS``: ``tree_verify_attention`` for each tile configuration,

and the largest difference of each masked output from SGLang's masked output and from a float32
reference. Times: ``triton.testing.do_bench_cudagraph`` medians (the launch replayed from a CUDA
graph, as the server replays its verify; L2 not flushed) in ms per call.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def tree_mask(bs, width, prefix, gen, dev):
    """Random trees (each slot's parent an earlier slot), SGLang's FULL layout; and its ``mask_indptr``."""
    parts = []
    for b in range(bs):
        anc = torch.zeros(width, width, dtype=torch.bool)
        for i in range(width):
            anc[i, i] = True
            if i:
                anc[i] |= anc[int(torch.randint(0, i, (1,), generator=gen))]
        rows = torch.ones(width, int(prefix[b]) + width, dtype=torch.bool)
        rows[:, int(prefix[b]) :] = anc
        parts.append(rows.reshape(-1))
    mask = torch.cat(parts).to(dev)
    indptr = torch.zeros(bs + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(width * (prefix.to(torch.int64) + width), 0)
    return mask, indptr.to(dev)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bs", default="1,16,64")
    ap.add_argument("--prefix", default="40,200", help="LO,HI: prefix lengths uniform in [LO, HI]")
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--heads", default="32,8,128", help="query heads, KV heads, head dim")
    ap.add_argument("--configs", default="64,64,8;64,32,4;64,64,4;32,64,4;16,64,4;16,32,2;64,128,8")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("tree_attention benchmark: needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton.testing
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    from sglang_overlay.kernels import tree_attention as ta

    dev = torch.device("cuda")
    qh, kvh, dim = (int(x) for x in args.heads.split(","))
    lo, hi = (int(x) for x in args.prefix.split(","))
    width = args.width
    configs = [ta.TreeAttentionConfig(*(int(x) for x in c.split(","))) for c in args.configs.split(";")]
    gen = torch.Generator().manual_seed(0)
    results = {
        "device": torch.cuda.get_device_name(0),
        "heads": [qh, kvh, dim],
        "width": width,
        "prefix": [lo, hi],
        "timing": "do_bench_cudagraph median ms",
        "cases": [],
    }
    head = "| bs | sglang causal | sglang mask | " + " | ".join(f"tree {tuple(c)}" for c in configs) + " |"
    print(
        f"# tree-verify attention, {results['device']}, q/kv heads {qh}/{kvh}, dim {dim}, W {width}, prefix {lo}-{hi}"
    )
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for bs in (int(b) for b in args.bs.split(",")):
        prefix = torch.randint(lo, hi + 1, (bs,), generator=gen)
        pool = int(prefix.sum()) + 4096
        tokens = bs * width
        q = torch.randn(tokens, qh, dim, generator=gen).to(torch.bfloat16).to(dev)
        k = torch.randn(tokens, kvh, dim, generator=gen).to(torch.bfloat16).to(dev)
        v = torch.randn(tokens, kvh, dim, generator=gen).to(torch.bfloat16).to(dev)
        k_buf = torch.randn(pool, kvh, dim, generator=gen).to(torch.bfloat16).to(dev)
        v_buf = torch.randn(pool, kvh, dim, generator=gen).to(torch.bfloat16).to(dev)
        kv_indices = torch.randperm(pool, generator=gen)[: int(prefix.sum())].to(dev)
        kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
        kv_indptr[1:] = torch.cumsum(prefix, 0)
        kv_indptr = kv_indptr.to(dev)
        qo_indptr = torch.arange(0, (bs + 1) * width, width, dtype=torch.int32, device=dev)
        mask, mask_indptr = tree_mask(bs, width, prefix, gen, dev)
        scale = 1.0 / dim**0.5

        def sglang(custom):
            o = torch.empty_like(q)
            return o, lambda: extend_attention_fwd(
                q,
                k,
                v,
                o,
                k_buf,
                v_buf,
                qo_indptr,
                kv_indptr,
                kv_indices,
                mask if custom else None,
                True,
                mask_indptr,
                width,
                1.0,
                1.0,
                scale,
            )

        def tree(cfg):
            o = torch.empty_like(q)
            return o, lambda: ta.tree_verify_attention(
                q,
                k,
                v,
                o,
                k_buf,
                v_buf,
                qo_indptr,
                kv_indptr,
                kv_indices,
                mask,
                mask_indptr,
                width,
                1.0,
                1.0,
                scale,
                cfg,
            )

        ref = ta.tree_verify_attention_torch(
            q, k, v, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, mask, mask_indptr, scale
        ).to(dev)
        case = {"bs": bs, "prefix_mean": float(prefix.float().mean()), "variants": []}
        o_mask = None
        row = [str(bs)]
        for name, (o, fn) in [("sglang causal", sglang(False)), ("sglang mask", sglang(True))] + [
            (f"tree {c[0]},{c[1]},{c[2]}", tree(c)) for c in configs
        ]:
            try:
                fn()
                torch.cuda.synchronize()
                ms = triton.testing.do_bench_cudagraph(fn, rep=200)
            except Exception as exc:  # noqa: BLE001 - a config that does not compile is a result too
                case["variants"].append({"name": name, "error": repr(exc)[:300]})
                row.append("error")
                continue
            entry = {"name": name, "ms": round(ms, 5)}
            if name != "sglang causal":
                entry["max_diff_ref"] = float((o.float() - ref).abs().max())
                if o_mask is None:
                    o_mask = o.clone()
                entry["max_diff_sglang_mask"] = float((o.float() - o_mask.float()).abs().max())
            case["variants"].append(entry)
            diff = f" (d {entry.get('max_diff_sglang_mask', 0):.1e})" if name.startswith("tree") else ""
            row.append(f"{ms * 1000:.1f} us{diff}")
        results["cases"].append(case)
        print("| " + " | ".join(row) + " |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
