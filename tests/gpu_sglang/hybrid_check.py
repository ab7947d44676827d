"""The lossless checks of DDTREE on a hybrid target, on the device: real SGLang 0.5.23 servers over the tiny Gated
DeltaNet target of train_hybrid.py (MODELS/tiny-hybrid, its drafter MODELS/tiny-hybrid-dflash).

Usage (on the device, after device-setup.sh): python hybrid_check.py OUT MODELS
  Servers (scenario.py's, the same flags but the algorithm, budget and environment), started together: NONE,
  DDTREE at budget 15 (top-k 8) and at budget 31 (top-k 4), both with --speculative-ddtree-allow-hybrid-unsafe,
  and the control: DDTREE budget 15 with DDTREE_HYBRID_CHAIN_STATE=1 (the linear-attention verify left a chain:
  each tree node continues from its predecessor in the window, lossy wherever the tree branches).
  Greedy (T = 0): the held-out prompts and longer ones (mixed prompt lengths), each with its own max_new_tokens
  (requests finish mid-step), at 1 and 16 concurrent requests (batches mixing lengths), token for token
  against NONE; each divergence's top-2 probabilities of the target (Transformers, float32): a near-tie
  (gap < NEAR_TIE) may go either way in bf16. Sampled (T = 1): scenario.py's runs on the branch prompts
  (each server its own --random-seed), analyze.py's chi-square of homogeneity against NONE.
Writes OUT/results-hybrid.json (raw outputs, the comparisons, the verdict) and OUT/server-hybrid-*.log.
The verdict: lossless when neither DDTREE server diverges from NONE but at near-ties and neither chi-square is
rejected; the check holds when it is lossless and the control's chi-square is rejected.
"""

import concurrent.futures as cf
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import analyze  # noqa: E402
import scenario as sc  # noqa: E402
import synth_lang as sl  # noqa: E402
import train_hybrid as th  # noqa: E402

SHAPE = "hybrid"
# SGLang's flags for the hybrid: the SSM state in float32 (the config says so too), the Triton linear-attention
# kernels (the ones whose tree verify takes parent pointers), a KV pool that lets four servers share one GPU.
HYBRID_FLAGS = ["--max-total-tokens", "65536", "--mamba-ssm-dtype", "float32", "--linear-attn-backend", "triton"]
sc.SHAPES[SHAPE] = (th.TARGET_DIR, th.DRAFTER_DIR, HYBRID_FLAGS, [])
UNSAFE = ["--speculative-ddtree-allow-hybrid-unsafe"]
CONTROL_ENV = "DDTREE_HYBRID_CHAIN_STATE=1"
# (name, budget, top-k) of the DDTREE servers; the control runs the first one's tree.
TREES = (("hybrid-ddtree-15", 15, 8), ("hybrid-ddtree-31", 31, 4))
CONTROL, NONE = "hybrid-control", "hybrid-none"
# A divergence counts as a near-tie when the target's top-2 probabilities there differ by less than this
# (a default: bf16 logits of a different batch shape move probabilities by about a percent).
NEAR_TIE = float(os.environ.get("HYBRID_NEAR_TIE", "0.05"))
LONG_PROMPTS = 8  # longer prompts beside the 64 held-out ones: 100-600 words
PORT = 30040


def prompts_and_lengths(lang):
    """The greedy prompts (held-out, then longer ones) and each one's max_new_tokens: 9..64, spread so that a
    batch's requests end at different steps, most of them inside a verify step."""
    prompts = lang.greedy_prompts() + lang.long_prompts(n=LONG_PROMPTS, lo=100, hi=600)
    return prompts, [9 + (i * 13) % 56 for i in range(len(prompts))]


def servers(out, models):
    """NONE, the DDTREE servers and the control (Server objects, not started)."""
    trees = TREES + ((CONTROL,) + TREES[0][1:],)
    group = [
        sc.Server(
            name, "DDTREE", sc.RELEASE, PORT + 1 + i, out, models, 1, 12 + i, SHAPE, False, UNSAFE, budget=b, top_k=k
        )
        for i, (name, b, k) in enumerate(trees)
    ]
    group[-1].set_env(CONTROL_ENV)
    none = sc.Server(NONE, "NONE", sc.RELEASE, PORT, out, models, seed=11, shape=SHAPE)
    return none, group


def greedy_mixed(server, prompts, lengths):
    res = {}
    for conc in (1, 16):
        t = time.time()
        jobs = [(p, {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}) for p, n in zip(prompts, lengths)]
        with cf.ThreadPoolExecutor(conc) as ex:
            outs = list(ex.map(lambda job: server.generate(*job), jobs))
        res["c%d" % conc] = {"outputs": outs, "seconds": round(time.time() - t, 2)}
    return res


def check_server(server, lang, prompts, lengths):
    """Greedy and sampled runs of one ready server; its record."""
    res = dict(server.info)
    for part, run in (
        ("greedy", lambda: greedy_mixed(server, prompts, lengths)),
        ("sampled", lambda: sc.sampled(server, lang.branch_prompts())),
    ):
        try:
            res[part] = run()
        except Exception as e:  # noqa: BLE001 (recorded as evidence; the next part still runs)
            res[part + "_error"] = repr(e)
    try:
        st = (server.get("/server_info").get("internal_states") or [{}])[0]
        res["avg_spec_accept_length"] = st.get("avg_spec_accept_length")
    except Exception as e:  # noqa: BLE001
        res["server_info_error"] = repr(e)
    return res


def compare(results):
    """Greedy comparisons against NONE (and NONE at 16 against NONE at 1) and the chi-squares."""
    none = results.get(NONE, {})
    greedy, chi = {}, {}
    if "greedy" in none:
        greedy["none_c16_vs_none_c1"] = analyze.greedy_compare(
            none["greedy"]["c1"]["outputs"], none["greedy"]["c16"]["outputs"]
        )
    for name, r in results.items():
        if name == NONE:
            continue
        for c in ("c1", "c16"):
            if "greedy" in r and "greedy" in none:
                greedy["%s_vs_none_%s" % (name, c)] = analyze.greedy_compare(
                    none["greedy"][c]["outputs"], r["greedy"][c]["outputs"]
                )
        if "sampled" in r and "sampled" in none:
            ref, oth = none["sampled"]["samples"], r["sampled"]["samples"]
            chi["%s_vs_none_t2_t5" % name] = analyze.homogeneity(analyze.categories(ref), analyze.categories(oth))
            chi["%s_vs_none_t2" % name] = analyze.homogeneity(
                analyze.categories(ref, 1, 2), analyze.categories(oth, 1, 2)
            )
    return greedy, chi


def margins(greedy, prompts, models):
    """The target's top-2 next-token probabilities (float32) at each first divergence, on the common prefix."""
    import torch

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = th.load_target(os.path.join(models, th.TARGET_DIR), dev, torch.float32)
    lang, seen = sl.Language(), {}
    for cmp_ in greedy.values():
        for fd in cmp_["first_diff"]:
            key = (fd["prompt"], fd["position"], tuple(fd["_prefix"]))
            if key not in seen:
                ids = lang.encode(prompts[fd["prompt"]]) + fd["_prefix"]
                with torch.no_grad():
                    probs = torch.softmax(model(input_ids=torch.tensor([ids], device=dev)).logits[0, -1].float(), -1)
                top = torch.topk(probs, 2)
                seen[key] = {
                    "top2_tokens": top.indices.tolist(),
                    "top2_probs": [round(v, 4) for v in top.values.tolist()],
                }
            fd.update(seen[key], near_tie=seen[key]["top2_probs"][0] - seen[key]["top2_probs"][1] < NEAR_TIE)


def verdict(greedy, chi, results):
    """Lossless: every DDTREE divergence from NONE a near-tie, no DDTREE chi-square rejected, every DDTREE server
    answered; the check holds when lossless and the control's t2..t5 chi-square is rejected."""
    trees = [name for name, _b, _k in TREES]
    far = {
        k: [fd for fd in v["first_diff"] if not fd.get("near_tie")]
        for k, v in greedy.items()
        if k.split("_vs_")[0] in trees
    }
    rejected = {k: v["rejected_at_0.001"] for k, v in chi.items() if k.split("_vs_")[0] in trees}
    answered = all("greedy" in results.get(n, {}) and "sampled" in results.get(n, {}) for n in trees + [NONE])
    lossless = answered and not any(far.values()) and not any(rejected.values())
    control = chi.get("%s_vs_none_t2_t5" % CONTROL, {}).get("rejected_at_0.001")
    return {
        "answered": answered,
        "lossless": lossless,
        "divergences_not_near_tie": {k: len(v) for k, v in far.items()},
        "ddtree_chi_square_rejected": rejected,
        "control_rejected": control,
        "holds": bool(lossless and control),
        "near_tie": NEAR_TIE,
    }


def dump(out, doc):
    with open(os.path.join(out, "results-hybrid.json"), "w") as fh:
        json.dump(doc, fh)


def main():
    sc.exit_on_sigterm()
    out, models = sys.argv[1], sys.argv[2]
    lang = sl.Language()
    prompts, lengths = prompts_and_lengths(lang)
    none, group = servers(out, models)
    results, t0 = {}, time.time()
    doc = {
        "plan": "hybrid",
        "language": lang.kind,
        "greedy_prompts": prompts,
        "max_new_tokens": lengths,
        "branch_prompts": lang.branch_prompts(),
        "servers": results,
    }

    def work(ready):
        with cf.ThreadPoolExecutor(len(ready)) as ex:
            for s, res in zip(ready, ex.map(lambda s: check_server(s, lang, prompts, lengths), ready)):
                results[s.name] = res
        dump(out, doc)

    try:
        # all four together: their start-ups (kernel compilation, graph captures) overlap, inside one device call
        sc.in_groups([[none] + group], work, sc.call_deadline(), "hybrid")
    finally:
        for s in [none] + group:
            results.setdefault(s.name, s.info)
        greedy, chi = compare(results)
        try:
            margins(greedy, prompts, models)
        except Exception as e:  # noqa: BLE001 (the margins are evidence; the comparisons stand without them)
            doc["margins_error"] = repr(e)
        doc.update(
            greedy=greedy, chi_square=chi, verdict=verdict(greedy, chi, results), seconds=round(time.time() - t0, 1)
        )
        dump(out, doc)
        print(
            json.dumps(
                {
                    "verdict": doc["verdict"],
                    "acceptance": {n: r.get("avg_spec_accept_length") for n, r in results.items()},
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
