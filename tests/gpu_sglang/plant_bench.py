"""The decode step's cost by accepted path: DDTREE with planted paths against DFLASH, in one run.

Usage (on the device, after device-setup.sh): python plant_bench.py OUT MODELS
Starts a DFLASH server and one DDTREE server per budget or schedule in PLANT_BUDGETS (`;`-separated, default "15":
window 16; "15;31" adds window 32; "15;1:31,16:15,64:15" a schedule, whose window 16 runs on a second target
state), every one with scenario.py's flags (CUDA graphs on), on PERF_TARGET (default qwen3-8b: random weights) with
PERF_DRAFTER's drafter. Each DDTREE server reads its planted path from a file (the overlay's
DDTREE_PLANT_PATH=@FILE, kernels/plant_path.py): `none` (the target's own acceptance), or `RANK DEPTH` (from the
root, DEPTH times the first, middle or last child in best-first order), rewritten between measurements, so one
server measures every path. For each concurrency (PLANT_CONCS, default 1,16,64; a budget's server only at the
concurrencies PLANT_BUDGET_CONCS gives it, e.g. "31@1;1:31,16:15@1,16") and each prompt set (`short`: the held-out
prompts; `long`: those prompts joined to about PLANT_LONG_WORDS words, default 1000, at the concurrencies PLANT_LONG_CONCS,
default 1,16: the 8B shapes' KV pool holds 32768 tokens), it profiles PLANT_STEPS decode steps
(default 24; SGLang's torch profiler, GPU activity; profile_step.py's summary): the span per step (the step's
length, idle gaps included), the GPU busy time per step and the kernels. Plants: PLANT_PATHS (default
"none;first 15;middle 15;last 15").
Writes OUT/results-plant-TARGET.json and prints, per cell, DDTREE's span over DFLASH's in the same run.
"""

import concurrent.futures as cf
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import profile_step as ps  # noqa: E402
import scenario as sc  # noqa: E402
import synth_lang as sl  # noqa: E402

STEPS = int(os.environ.get("PLANT_STEPS", "24"))


def long_prompts(prompts, words):
    """Each prompt followed by the next ones until it holds about `words` words (the prefix a verify attends)."""
    out = []
    for i in range(len(prompts)):
        text, j = prompts[i], i
        while len(text.split()) < words:
            j += 1
            text += " " + prompts[j % len(prompts)]
        out.append(" ".join(text.split()[:words]))
    return out


def budget_concs(text):
    """PLANT_BUDGET_CONCS, "BUDGET@C1,C2;..." -> {budget: {C1, C2}} (a budget or schedule as PLANT_BUDGETS spells it)."""
    out = {}
    for item in text.split(";"):
        if not item.strip():
            continue
        budget, sep, concs = item.strip().rpartition("@")
        if not sep or not budget:
            raise ValueError("PLANT_BUDGET_CONCS item %r: expected BUDGET@C1,C2" % item)
        out[budget] = {int(c) for c in concs.split(",")}
    return out


def wave(server, prompts, conc, new_tokens):
    params = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    with cf.ThreadPoolExecutor(conc) as ex:
        return list(ex.map(lambda p: server.generate(p, params), prompts[:conc]))


def new_tokens_for(plant):
    """Enough tokens that one wave's requests decode for PLANT_STEPS steps (and a few more) at the plant's
    longest path, so the profiled steps are decode steps, not the next wave's prefills."""
    words = plant.split()
    per_step = int(words[1]) + 1 if len(words) == 2 else int(os.environ.get("PLANT_NATURAL_ACCEPT", "4"))
    return per_step * (STEPS + 8)


def profile_cell(server, prompts, conc, key, out, plant="none"):
    """One profiled measurement: a short warm-up wave, then PLANT_STEPS decode steps under the profiler."""
    wave(server, prompts, conc, 16)
    new_tokens = new_tokens_for(plant)
    pdir = os.path.join(out, "prof", key.replace("/", "-").replace(" ", "_"))
    os.makedirs(pdir, exist_ok=True)
    ps.start_profile(
        server,
        {"output_dir": pdir, "num_steps": STEPS, "activities": ["GPU"], "profile_id": os.path.basename(pdir)},
    )
    outs, trace = ps.waves_until_trace(lambda: wave(server, prompts, conc, new_tokens), pdir, 90)
    result = ps.summarize(trace, STEPS) if trace else {"error": "no trace in %s" % pdir}
    result["mean_accept"] = sum(o["accept"] or 0 for o in outs) / max(1, len(outs))
    result["top"] = result.get("top", [])[:15]
    return result


def main():
    sc.exit_on_sigterm()
    out, models = sys.argv[1], sys.argv[2]
    shape = os.environ.get("PERF_TARGET", "qwen3-8b")
    drafter = os.environ.get("PERF_DRAFTER") or None
    base = sl.greedy_prompts(sl.Language())
    base = (base * (64 // len(base) + 1))[:64]
    sets = {"short": base, "long": long_prompts(base, int(os.environ.get("PLANT_LONG_WORDS", "1000")))}
    concs = [int(c) for c in os.environ.get("PLANT_CONCS", "1,16,64").split(",")]
    plants = [p.strip() for p in os.environ.get("PLANT_PATHS", "none;first 15;middle 15;last 15").split(";")]
    budgets = [b.strip() for b in os.environ.get("PLANT_BUDGETS", "15").split(";") if b.strip()]
    long_concs = os.environ.get("PLANT_LONG_CONCS", "1,16").split(",")
    only = budget_concs(os.environ.get("PLANT_BUDGET_CONCS", ""))
    servers = [sc.Server("plant-dflash", "DFLASH", sc.RELEASE, 30121, out, models, shape=shape, drafter=drafter)]
    plant_files = {}
    for i, budget in enumerate(budgets):
        s = sc.Server(
            "plant-ddtree-%d" % i,
            "DDTREE",
            sc.RELEASE,
            30122 + i,
            out,
            models,
            shape=shape,
            drafter=drafter,
            budget=budget,
            top_k=None,
        )
        plant_files[s.name] = os.path.join(out, "plant-%d" % i)
        s.info["budget"] = budget
        with open(plant_files[s.name], "w") as fh:
            fh.write("none")
        s.set_env("DDTREE_PLANT_PATH=@" + plant_files[s.name])
        servers.append(s)
    doc = {"plan": "plant", "target": shape, "steps": STEPS, "plants": plants, "results": {}}
    t0 = time.time()
    try:
        ready = sc.start_group(servers)
        print("[plant] ready after %.0f s: %s" % (time.time() - t0, [s.name for s in ready]), flush=True)
        for conc in concs:
            for set_name, prompts in sets.items():
                if set_name == "long" and str(conc) not in long_concs:
                    continue
                for s in ready:
                    budget = s.info.get("budget")
                    if s.algo == "DDTREE" and budget in only and conc not in only[budget]:
                        continue
                    for plant in plants if s.algo == "DDTREE" else ["-"]:
                        if sc.call_deadline() and time.time() > sc.call_deadline() - 20:
                            raise TimeoutError("the call's deadline")
                        if s.algo == "DDTREE":
                            with open(plant_files[s.name], "w") as fh:
                                fh.write(plant)
                        key = "%s/c%d/%s/%s" % (s.name, conc, set_name, plant)
                        r = profile_cell(s, prompts, conc, key, out, plant if s.algo == "DDTREE" else "none")
                        doc["results"][key] = r
                        print(
                            "[plant] %s: span %s ms/step, busy %s, accept %.2f"
                            % (key, r.get("span_ms_per_step"), r.get("busy_ms_per_step"), r["mean_accept"]),
                            flush=True,
                        )
    except TimeoutError as exc:
        doc["stopped"] = str(exc)
    finally:
        for s in servers:
            s.stop()
        doc["seconds"] = round(time.time() - t0, 1)
        doc["servers"] = {s.name: s.info for s in servers}
        with open(os.path.join(out, "results-plant-%s.json" % shape), "w") as fh:
            json.dump(doc, fh, indent=1)
    for key, r in doc["results"].items():
        if "dflash" in key:
            continue
        _name, conc, set_name, _plant = key.split("/")
        dflash = doc["results"].get("plant-dflash/%s/%s/-" % (conc, set_name), {})
        if r.get("span_ms_per_step") and dflash.get("span_ms_per_step"):
            print(
                "[plant] %-40s span %.3f vs DFLASH %.3f: %.3f"
                % (
                    key,
                    r["span_ms_per_step"],
                    dflash["span_ms_per_step"],
                    r["span_ms_per_step"] / dflash["span_ms_per_step"],
                )
            )


if __name__ == "__main__":
    main()
