"""The offline acceptance of saved drafter levels over outputs of any length: DFLASH's chain and DDTrees of
the given budgets along the target's greedy text (train_models.simulate_acceptance), with no server.

Usage: python offline_accept.py MODELS NAME[,NAME...] [--tokens 256] [--budgets 63,127] [--prompts 16]
       [--json OUT]      (SYNTH_LANG picks the language, as for train_models.py; a GPU when there is one)

Why: a level is saved by its acceptance over 64 tokens, while the perf runs serve 256. The drafters train on
continuations that end near position 128, so a longer output runs past what they saw: the chain accepts less
and a tree recovers more of it. This says, before a device call, which level serves about the acceptance a run
needs and which budget its tree needs. On the CPU it runs in float32 and reads somewhat higher than the
device's bfloat16 (the evidence README compares the two).
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synth_lang as sl  # noqa: E402
import train_models as tm  # noqa: E402


def offline_acceptance(models: str, names: list, tokens: int, budgets: list, prompts: int, dev) -> dict:
    """{name: {"chain": mean, "<budget>": mean, ...}} over the first `prompts` held-out prompts."""
    from transformers import Qwen3ForCausalLM

    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    target = Qwen3ForCausalLM.from_pretrained(os.path.join(models, "tiny-qwen3"), dtype=dtype).to(dev).eval()
    embed, head = target.get_input_embeddings(), target.lm_head.weight.detach()
    held_out = tm.held_out_prompts(sl.Language())[:prompts]
    check = [(tm.greedy_continue(target, [p], tokens, dev), len(p)) for p in held_out]
    out = {}
    for name in names:
        drafter = tm.Drafter.from_pretrained(os.path.join(models, name)).to(dev).eval()
        out[name] = {}
        for budget in [None] + budgets:
            accept = tm.mean_acceptance(drafter, target, embed, head, check, dev, budget)
            out[name]["chain" if budget is None else str(budget)] = round(accept, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models")
    parser.add_argument("names", help="drafter directories under MODELS, comma-separated")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--budgets", default="63,127")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--json")
    args = parser.parse_args()
    t0 = time.time()
    budgets = [int(b) for b in args.budgets.split(",") if b]
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result = offline_acceptance(args.models, args.names.split(","), args.tokens, budgets, args.prompts, dev)
    doc = {
        "language": sl.Language().kind,
        "tokens": args.tokens,
        "prompts": args.prompts,
        "device": dev.type,
        "accept": result,
        "seconds": round(time.time() - t0, 1),
    }
    print("| level | chain | " + " | ".join("DDTree %d" % b for b in budgets) + " |")
    print("| --- |" + " --- |" * (len(budgets) + 1))
    for name, row in result.items():
        cells = ["%.3f (%.2fx)" % (row[str(b)], row[str(b)] / row["chain"]) for b in budgets]
        print("| %s | %.3f | %s |" % (name, row["chain"], " | ".join(cells)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)


if __name__ == "__main__":
    main()
