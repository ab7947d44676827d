"""Fused draft top-k benchmark: ``kernels.draft_topk.fused_draft_topk`` vs ``core.tree.draft_topk``.

    PYTHONPATH=sglang_overlay/src python3 sglang_overlay/benchmarks/draft_topk.py [--json out.json]

Needs a CUDA GPU. For each (rows, vocabulary, k) -- by default the issue's shape, 64 requests x 15
draft positions of a 151936-token vocabulary, bf16 -- it times, in the same run:

* ``draft_topk(stable=True)`` (float32 cast, ``log_softmax``, stable sort; the documented tie rule),
* ``draft_topk(stable=False)`` (``torch.topk``; what the server used before the fused kernel),
* ``fused_draft_topk`` with ``span=1`` (``_chunk_topk_kernel``: one selection per chunk) for
  several chunk sizes (default pre-filter group) and, at the default chunk size, other pre-filter
  group sizes,
* ``fused_draft_topk`` at the default chunk size with each ``--spans`` value > 1
  (``_span_topk_kernel``: one selection per ``span`` chunks),

and checks each fused result against the stable one (ids identical, max log-prob difference) and
each span's against ``span=1`` bit for bit (ids and log-probs), also replayed from a CUDA graph.
Times are ``triton.testing.do_bench`` medians (CUDA events, warm-up, L2 flushed between calls).
Also: ``memory bound`` = the time to read the logits once at the measured copy bandwidth
(``torch`` clone of the same tensor / 2), the floor for any one-pass kernel.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

#: What each span's result is checked for against ``span=1`` (all must hold for the best span).
SPAN_CHECKS = ("ids_equal_span1", "lp_bitwise_equal_span1", "graph_replay_equal")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="960,240,15", help="comma list of rows (requests x 15)")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--k", default="8,15")
    ap.add_argument("--blocks", default="2048,4096,8192")
    ap.add_argument("--groups", default="8,32", help="pre-filter group sizes also timed at the default block")
    ap.add_argument("--spans", default="2,4,8,16", help="chunks per selection program timed at the default block")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--json", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("draft_topk benchmark: needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton.testing

    from sglang_overlay.core.tree import draft_topk
    from sglang_overlay.kernels.draft_topk import DEFAULT_BLOCK, DEFAULT_GROUP, fused_draft_topk

    dtype = getattr(torch, args.dtype)
    dev = torch.device("cuda")
    blocks = [int(b) for b in args.blocks.split(",")]
    groups = [int(g) for g in args.groups.split(",") if g.strip()]
    spans = [int(p) for p in args.spans.split(",") if p.strip() and int(p) > 1]
    results = {
        "device": torch.cuda.get_device_name(0),
        "dtype": args.dtype,
        "vocab": args.vocab,
        "default_block": DEFAULT_BLOCK,
        "default_group": DEFAULT_GROUP,
        "cases": [],
    }
    print(f"# fused draft top-k on {results['device']}, {args.dtype}, vocabulary {args.vocab}")
    print()
    head = (
        "| rows | k | stable sort ms | torch.topk ms | "
        + " | ".join(f"fused b{b} ms" for b in blocks)
        + "".join(f" | fused g{g} ms" for g in groups)
        + "".join(f" | span{p} ms" for p in spans)
        + (
            " | best span | best/span1 | best span ids+lp == span1 | fused/stable | fused/topk | read-once ms"
            " | ids equal | max lp diff |"
        )
    )
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    gen = torch.Generator(device=dev).manual_seed(0)
    for rows in (int(r) for r in args.rows.split(",")):
        # Draft-like logits: a few strong candidates over a long tail, in the server's dtype.
        logits = (torch.randn(rows, args.vocab, device=dev, generator=gen) * 2.5).to(dtype)
        copy_ms = triton.testing.do_bench(lambda: logits.clone()) / 2
        for k in (int(x) for x in args.k.split(",")):
            t_stable = triton.testing.do_bench(lambda: draft_topk(logits, k, stable=True))
            t_topk = triton.testing.do_bench(lambda: draft_topk(logits, k, stable=False))
            t_fused = {}
            for b in blocks:
                t_fused[b] = triton.testing.do_bench(lambda b=b: fused_draft_topk(logits, k, block=b, span=1))
            t_group = {}
            for g in groups:
                t_group[g] = triton.testing.do_bench(lambda g=g: fused_draft_topk(logits, k, group=g, span=1))
            want_lp, want_ids = draft_topk(logits, k, stable=True)
            got_lp, got_ids = fused_draft_topk(logits, k, span=1)
            t_span, span_check = {}, {}
            for p in spans:
                t_span[p] = triton.testing.do_bench(lambda p=p: fused_draft_topk(logits, k, span=p))
                p_lp, p_ids = fused_draft_topk(logits, k, span=p)
                # The same call replayed from a CUDA graph (how the adapter's tree stage runs it).
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    g_lp, g_ids = fused_draft_topk(logits, k, span=p)
                graph.replay()
                torch.cuda.synchronize()
                span_check[p] = {
                    "ids_equal_span1": bool(torch.equal(p_ids, got_ids)),
                    "lp_bitwise_equal_span1": bool(torch.equal(p_lp.view(torch.int32), got_lp.view(torch.int32))),
                    "ids_equal_stable": bool(torch.equal(p_ids, want_ids)),
                    "max_lp_diff_stable": float((p_lp - want_lp).abs().max()),
                    "graph_replay_equal": bool(
                        torch.equal(g_ids, p_ids) and torch.equal(g_lp.view(torch.int32), p_lp.view(torch.int32))
                    ),
                }
            best_span = min(t_span, key=t_span.get) if t_span else 1
            ids_equal = bool(torch.equal(got_ids, want_ids))
            lp_diff = float((got_lp - want_lp).abs().max())
            best = t_fused[DEFAULT_BLOCK]
            case = {
                "rows": rows,
                "k": k,
                "stable_ms": t_stable,
                "topk_ms": t_topk,
                "fused_ms": {str(b): t for b, t in t_fused.items()},
                "fused_default_ms": best,
                "fused_group_ms": {str(g): t for g, t in t_group.items()},
                "span_ms": {str(p): t for p, t in t_span.items()},
                "span_check": {str(p): c for p, c in span_check.items()},
                "best_span": best_span,
                "ratio_best_span_to_span1": (t_span[best_span] / best) if t_span else 1.0,
                "ratio_fused_to_stable": best / t_stable,
                "ratio_fused_to_topk": best / t_topk,
                "read_once_ms": copy_ms,
                "ids_equal": ids_equal,
                "max_lp_diff": lp_diff,
            }
            results["cases"].append(case)
            if args.json:  # after every case: a run cut short keeps what it measured
                with open(args.json, "w") as f:
                    json.dump(results, f, indent=2)
            print(
                f"| {rows} | {k} | {t_stable:.3f} | {t_topk:.3f} | "
                + " | ".join(f"{t_fused[b]:.3f}" for b in blocks)
                + "".join(f" | {t_group[g]:.3f}" for g in groups)
                + "".join(f" | {t_span[p]:.3f}" for p in spans)
                + (
                    f" | {best_span} | {t_span[best_span] / best:.3f} | "
                    f"{all(span_check[best_span][c] for c in SPAN_CHECKS)}"
                    if t_span
                    else " | 1 | 1.000 | True"
                )
                + f" | {best / t_stable:.3f} | {best / t_topk:.3f} | {copy_ms:.3f} | {ids_equal} | {lp_diff:.2e} |"
            )
    results["all_spans_bit_equal_span1"] = all(
        c["ids_equal_span1"] and c["lp_bitwise_equal_span1"] and c["graph_replay_equal"]
        for case in results["cases"]
        for c in case["span_check"].values()
    )
    results["all_ids_equal_stable"] = all(case["ids_equal"] for case in results["cases"]) and all(
        c["ids_equal_stable"] for case in results["cases"] for c in case["span_check"].values()
    )
    print(
        f"# every span bit-equal to span=1 (ids, log-probs, graph replay): {results['all_spans_bit_equal_span1']}; "
        f"every fused id list equal to the stable sort's: {results['all_ids_equal_stable']}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
