"""Turn the device scenario's raw results into the evidence summary.

  python analyze.py --device-summary DIR        print a short summary of DIR/results-*.json (on the device)
  python analyze.py EVIDENCE_DIR [--model MODELS]
        read EVIDENCE_DIR/{meta,results-tp1,results-tp2,train,checks}.json, write EVIDENCE_DIR/summary.json;
        --model (needs torch + transformers): the target's top-2 probabilities at each greedy divergence, and
        each server's sampled (t1, t2) against the target's exact distribution (chi-square goodness of fit)

Greedy: every speculative server's output vs NONE's at the same concurrency, token for token: how many of
the prompts diverge and the first differing position of each. Sampled (T = 1): a chi-square test of
homogeneity (alpha 0.001) between NONE's samples and each speculative server's, over the tokens produced
after the first (t2..t5, per prompt; cells with fewer than 10 draws in both together pooled into one).
"""

import json
import os
import sys

ALPHA = 0.001


def load(path):
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh)


def chi2_sf(stat, dof):
    try:
        from scipy.stats import chi2

        return float(chi2.sf(stat, dof))
    except ImportError:
        import torch

        return float(
            torch.special.gammaincc(
                torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0, dtype=torch.float64)
            )
        )


def homogeneity(a_counts, b_counts, min_cell=10):
    """Chi-square test of homogeneity for two samples of categories (dicts category -> count)."""
    cats = sorted(set(a_counts) | set(b_counts))
    rows, rare = [], [0, 0]
    for c in cats:
        a, b = a_counts.get(c, 0), b_counts.get(c, 0)
        if a + b < min_cell:
            rare[0] += a
            rare[1] += b
        else:
            rows.append((a, b))
    if sum(rare):
        rows.append(tuple(rare))
    na, nb = sum(r[0] for r in rows), sum(r[1] for r in rows)
    n = na + nb
    stat = 0.0
    for a, b in rows:
        tot = a + b
        for obs, col in ((a, na), (b, nb)):
            exp = tot * col / n
            if exp > 0:
                stat += (obs - exp) ** 2 / exp
    dof = max(1, len(rows) - 1)
    p = chi2_sf(stat, dof)
    return {
        "n_a": na,
        "n_b": nb,
        "cells": len(rows),
        "dof": dof,
        "chi2": round(stat, 3),
        "p_value": p,
        "rejected_at_0.001": p < ALPHA,
    }


def categories(samples, lo=1, hi=5):
    counts = {}
    for prompt, outs in samples.items():
        for ids in outs:
            if ids is None:
                continue
            key = "%s|%s" % (prompt, " ".join(str(t) for t in ids[lo:hi]))
            counts[key] = counts.get(key, 0) + 1
    return counts


def greedy_compare(ref, other):
    out = {"prompts": len(ref), "diverged": 0, "first_diff": []}
    for i, (a, b) in enumerate(zip(ref, other)):
        a, b = a["ids"], b["ids"]
        if a == b:
            continue
        out["diverged"] += 1
        pos = next((j for j, (x, y) in enumerate(zip(a or [], b or [])) if x != y), min(len(a or []), len(b or [])))
        tokens = [(a or [])[pos : pos + 1], (b or [])[pos : pos + 1]]
        out["first_diff"].append({"prompt": i, "position": pos, "tokens": tokens, "_prefix": (a or [])[:pos]})
    return out


def mean(xs):
    xs = [x for x in xs if x is not None]
    return round(sum(xs) / len(xs), 3) if xs else None


def summarize_tp1(res):
    s = res["servers"]
    out = {"servers": {}, "greedy": {}, "acceptance": {}, "chi_square": {}}
    for name, r in s.items():
        out["servers"][name] = {k: r.get(k) for k in ("algorithm", "release", "ready_s", "error", "server_info")}
    none = s.get("none", {})
    for name in ("dflash", "ddtree", "ddtree-control"):
        r = s.get(name, {})
        for c in ("c1", "c16"):
            if "greedy" in r and "greedy" in none:
                out["greedy"]["%s_vs_none_%s" % (name, c)] = greedy_compare(
                    none["greedy"][c]["outputs"], r["greedy"][c]["outputs"]
                )
            if "greedy" in r:
                out["acceptance"]["%s_%s" % (name, c)] = mean(o["accept"] for o in r["greedy"][c]["outputs"])
        if "sampled" in r:
            out["acceptance"]["%s_sampled_T1" % name] = r["sampled"].get("mean_accept")
    if "greedy" in none:
        out["greedy"]["none_c16_vs_none_c1"] = greedy_compare(
            none["greedy"]["c1"]["outputs"], none["greedy"]["c16"]["outputs"]
        )
    if "greedy" in s.get("ddtree", {}) and "greedy" in s.get("dflash", {}):
        out["greedy"]["ddtree_vs_dflash_c1"] = greedy_compare(
            s["dflash"]["greedy"]["c1"]["outputs"], s["ddtree"]["greedy"]["c1"]["outputs"]
        )
    if "sampled" in none:
        ref = none["sampled"]["samples"]
        out["chi_square"]["none_samples"] = sum(len(v) for v in ref.values())
        t2 = {}
        for prompt, outs in ref.items():
            for ids in outs:
                k = "%s|%s" % (prompt, ids[1] if ids and len(ids) > 1 else None)
                t2[k] = t2.get(k, 0) + 1
        out["chi_square"]["none_t2_distribution"] = dict(sorted(t2.items(), key=lambda kv: -kv[1])[:24])
        for name in ("dflash", "ddtree", "ddtree-control"):
            if "sampled" in s.get(name, {}):
                oth = s[name]["sampled"]["samples"]
                out["chi_square"]["%s_vs_none_t2_t5" % name] = homogeneity(categories(ref), categories(oth))
                out["chi_square"]["%s_vs_none_t2" % name] = homogeneity(categories(ref, 1, 2), categories(oth, 1, 2))
    return out


def summarize_tp2(res, tp1):
    s = res["servers"]
    out = {
        "servers": {
            n: {k: r.get(k) for k in ("algorithm", "tp", "ready_s", "error", "server_info")} for n, r in s.items()
        },
        "greedy": {},
        "acceptance": {},
    }
    refs = {}
    if tp1:
        for n in ("none", "ddtree"):
            if "greedy" in tp1["servers"].get(n, {}):
                refs[n + "_tp1"] = tp1["servers"][n]["greedy"]
    for name, r in s.items():
        if "greedy" not in r:
            continue
        for c in ("c1", "c16"):
            out["acceptance"]["%s_%s" % (name, c)] = mean(o["accept"] for o in r["greedy"][c]["outputs"])
            for rn, rg in refs.items():
                out["greedy"]["%s_vs_%s_%s" % (name, rn, c)] = greedy_compare(
                    rg[c]["outputs"], r["greedy"][c]["outputs"]
                )
    if "greedy" in s.get("none-tp2", {}) and "greedy" in s.get("ddtree-tp2", {}):
        for c in ("c1", "c16"):
            out["greedy"]["ddtree-tp2_vs_none-tp2_%s" % c] = greedy_compare(
                s["none-tp2"]["greedy"][c]["outputs"], s["ddtree-tp2"]["greedy"][c]["outputs"]
            )
    return out


def brief(summary):
    lines = []
    for part in ("tp1", "sampled", "tp2"):
        sm = summary.get(part)
        if not sm:
            continue
        for n, v in sm["servers"].items():
            lines.append("%s server %s: ready %s s, error %s" % (part, n, v.get("ready_s"), v.get("error")))
        for k, v in sm["greedy"].items():
            lines.append(
                "%s greedy %s: %d/%d diverged %s" % (part, k, v["diverged"], v["prompts"], v["first_diff"][:6])
            )
        lines.append("%s acceptance %s" % (part, sm["acceptance"]))
        for k, v in list(sm.get("chi_square", {}).items()) + list(sm.get("chi_square_vs_exact_target", {}).items()):
            if isinstance(v, dict) and "p_value" in v:
                lines.append(
                    "%s chi2 %s: chi2=%s dof=%s p=%.3g rejected=%s"
                    % (part, k, v["chi2"], v["dof"], v["p_value"], v["rejected_at_0.001"])
                )
    return "\n".join(lines)


def margins(summary, tp1, models):
    """For each greedy divergence: the target's own top-2 next-token probabilities (fp32, Hugging Face, CPU)
    at the first differing position, on the common prefix. A near-tie there means bf16 rounding (a
    different kernel or batch shape) may legitimately pick either token."""
    import torch
    from transformers import Qwen3ForCausalLM

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import synth_lang as sl

    model = Qwen3ForCausalLM.from_pretrained(os.path.join(models, "tiny-qwen3"), dtype=torch.float32).eval()
    lang = sl.Language(kind=tp1.get("language"))  # results record their language; older ones: SYNTH_LANG
    seen = {}
    for part in ("tp1", "tp2"):
        for name, cmp_ in summary.get(part, {}).get("greedy", {}).items():
            for fd in cmp_["first_diff"]:
                key = (fd["prompt"], fd["position"])
                if key in seen:
                    continue
                ids = lang.encode(tp1["greedy_prompts"][fd["prompt"]]) + fd["_prefix"]
                with torch.no_grad():
                    probs = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
                top = torch.topk(probs, 2)
                seen[key] = {
                    "prompt": fd["prompt"],
                    "position": fd["position"],
                    "top2_tokens": top.indices.tolist(),
                    "top2_probs": [round(v, 4) for v in top.values.tolist()],
                    "first_seen_in": "%s %s" % (part, name),
                }
    return list(seen.values())


def exact_fit(results, models, min_expected=5.0):
    """Goodness of fit of each server's sampled (t1, t2) per prompt against the target's exact distribution
    P(t1 | prompt) P(t2 | prompt, t1), computed in fp32 with Hugging Face on the same weights: a test of
    each server alone, independent of NONE's samples and of how the servers' random streams relate."""
    import torch
    from transformers import Qwen3ForCausalLM

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import synth_lang as sl

    model = Qwen3ForCausalLM.from_pretrained(os.path.join(models, "tiny-qwen3"), dtype=torch.float32).eval()

    def probs(ids):
        with torch.no_grad():
            return torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)

    lang = sl.Language(kind=results.get("language"))  # results record their language; older ones: SYNTH_LANG
    exact = {}
    for pi, prompt in enumerate(results["branch_prompts"]):
        ids = lang.encode(prompt)
        p1 = probs(ids)
        joint = {}
        for t1 in torch.nonzero(p1 > 1e-5).view(-1).tolist():
            p2 = probs(ids + [t1]) * p1[t1]
            for t2 in torch.nonzero(p2 > 1e-7).view(-1).tolist():
                joint[(t1, t2)] = float(p2[t2])
        exact[str(pi)] = joint
    out = {}
    for name, r in results["servers"].items():
        if "sampled" not in r:
            continue
        stat, dof = 0.0, 0
        for pi, outs in r["sampled"]["samples"].items():
            n = len(outs)
            obs = {}
            for o in outs:
                obs[(o[0], o[1])] = obs.get((o[0], o[1]), 0) + 1
            kept = {c: pr * n for c, pr in exact[pi].items() if pr * n >= min_expected}
            other_e = n - sum(kept.values())
            other_o = n - sum(obs.get(c, 0) for c in kept)
            cells = [(obs.get(c, 0), e) for c, e in kept.items()]
            if other_e > 1e-9:
                cells.append((other_o, other_e))
            stat += sum((o - e) ** 2 / e for o, e in cells)
            dof += len(cells) - 1
        p = chi2_sf(stat, dof)
        out[name] = {
            "chi2": round(stat, 3),
            "dof": dof,
            "p_value": p,
            "rejected_at_0.001": p < ALPHA,
            "samples": sum(len(v) for v in r["sampled"]["samples"].values()),
        }
    return out


def strip_prefixes(summary):
    for part in ("tp1", "tp2"):
        for cmp_ in summary.get(part, {}).get("greedy", {}).values():
            for fd in cmp_["first_diff"]:
                fd.pop("_prefix", None)


def build(d):
    summary = {}
    tp1 = load(os.path.join(d, "results-tp1.json"))
    tp2 = load(os.path.join(d, "results-tp2.json"))
    if tp1:
        summary["tp1"] = summarize_tp1(tp1)
    sampled = load(os.path.join(d, "results-sampled.json"))
    if sampled:
        summary["sampled"] = summarize_tp1(sampled)
    if tp2:
        summary["tp2"] = summarize_tp2(tp2, tp1)
    return summary, tp1


def headline(summary):
    """The numbers the issue asks for, in one place."""
    h = {}
    t1, t2 = summary.get("tp1", {}), summary.get("tp2", {})
    for k, v in t1.get("greedy", {}).items():
        h["greedy_diverged_" + k] = "%d/%d" % (v["diverged"], v["prompts"])
    for k, v in t1.get("chi_square", {}).items():
        if isinstance(v, dict) and "p_value" in v and k.endswith("t2_t5"):
            h["chi2_p_" + k] = v["p_value"]
            h["chi2_rejected_" + k] = v["rejected_at_0.001"]
    h["samples_per_server"] = t1.get("chi_square", {}).get("none_samples")
    for part in ("sampled",):
        for k, v in summary.get(part, {}).get("chi_square", {}).items():
            if isinstance(v, dict) and "p_value" in v and k.endswith("t2_t5"):
                h["independent_seeds_chi2_p_" + k] = v["p_value"]
                h["independent_seeds_chi2_rejected_" + k] = v["rejected_at_0.001"]
    for part in ("tp1", "sampled"):
        for k, v in summary.get(part, {}).get("chi_square_vs_exact_target", {}).items():
            h["%s_exact_fit_p_%s" % (part, k)] = v["p_value"]
            h["%s_exact_fit_rejected_%s" % (part, k)] = v["rejected_at_0.001"]
    h["acceptance_length"] = t1.get("acceptance")
    if t2:
        h["tp2_servers"] = {n: {"ready_s": v.get("ready_s"), "error": v.get("error")} for n, v in t2["servers"].items()}
        for k, v in t2.get("greedy", {}).items():
            h["tp2_greedy_diverged_" + k] = "%d/%d" % (v["diverged"], v["prompts"])
        h["tp2_acceptance_length"] = t2.get("acceptance")
    return h


def main():
    if sys.argv[1] == "--device-summary":
        summary = build(sys.argv[2])[0]
        strip_prefixes(summary)
        print(brief(summary))
        return
    d = sys.argv[1]
    summary, tp1 = build(d)
    if "--model" in sys.argv:
        models = sys.argv[sys.argv.index("--model") + 1]
        summary["divergence_margins"] = margins(summary, tp1, models)
        for part in ("tp1", "sampled"):
            raw = load(os.path.join(d, "results-%s.json" % part))
            if raw and part in summary:
                summary[part]["chi_square_vs_exact_target"] = exact_fit(raw, models)
    strip_prefixes(summary)
    extra = {}
    if os.path.exists(os.path.join(d, "meta.json")):
        extra = load(os.path.join(d, "meta.json"))
    train = load(os.path.join(d, "train.json"))
    checks = load(os.path.join(d, "checks.json"))
    doc = dict(extra)
    doc["prompts"] = {
        "greedy": tp1["greedy_prompts"] if tp1 else None,
        "branch": tp1["branch_prompts"] if tp1 else None,
    }
    if train:
        doc["training"] = {
            k: train.get(k)
            for k in (
                "target_final_loss",
                "drafter_final_loss",
                "offline_accept_len",
                "seconds",
                "target",
                "drafter",
                "torch",
            )
        }
    doc["headline"] = headline(summary)
    doc.update(summary)
    if checks:
        doc["checks"] = {k: (v["rc"] if isinstance(v, dict) and "rc" in v else v) for k, v in checks.items()}
    with open(os.path.join(d, "summary.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    print(brief(summary))


if __name__ == "__main__":
    main()
