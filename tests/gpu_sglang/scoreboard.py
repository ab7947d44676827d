"""Add a perf or autotune run's measurements to the scoreboard: one row per DDTREE setting and concurrency.

Usage (here, after a device call): python tests/gpu_sglang/scoreboard.py RESULTS_JSON COMMIT
    [--scoreboard docs/evidence/gpu-sglang/scoreboard.json] [--shape NAME] [--layers N] [--drafter NAME]
    [--source FILE] [--gpu NAME] [--language NAME]

RESULTS_JSON is perf.py's ``results-perf.json`` or autotune_real.py's ``results-autotune-DRAFTER.json``
(``"plan": "autotune"``; rows_from_autotune).

A row compares one DDTREE server with the DFLASH and NONE servers of the same run, at one concurrency:
tokens/s (medians of the rounds after the warm-up round 0), DDTREE / DFLASH as the median of those rounds'
ratios and every round's ratio (each round measures every server once, one at a time), and the acceptance
lengths; for a streamed run (``PERF_STREAM=1``) also every server's decode step, ``step_ms``. ``shape`` and
``layers`` default to what the run's target says (``PERF_TARGET``, see ``SHAPES``). Rows already in the
scoreboard for the same source file and commit are replaced, so re-running the script is harmless.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "collections"))
from ansible_collections.ddtree.sglang.plugins.module_utils.ddtree_budget import parse_budget  # noqa: E402

#: PERF_TARGET -> (shape, layers, tp): what the scoreboard calls the target of a run.
SHAPES = {
    "tiny": ("tiny-qwen3 (trained, 4 layers)", 4, 1),
    "qwen3-8b": ("Qwen3-8B (random weights)", 36, 1),
    "embedded-qwen3-8b": ("Qwen3-8B (tiny pair embedded)", 36, 1),
    "qwen3-30b-a3b": ("Qwen3-Coder-30B-A3B (random weights)", 48, 1),
    "embedded-qwen3-30b-a3b": ("Qwen3-Coder-30B-A3B (tiny pair embedded)", 48, 1),
}


def _by(runs: list[dict], server: str, concurrency: int, key: str) -> list[Any]:
    rows = [r for r in runs if r.get("server") == server and r.get("concurrency") == concurrency]
    return [r.get(key) for r in sorted(rows, key=lambda r: r.get("round", 0))]


def _warm(values: list) -> list:
    """The rounds after the first: round 0 is each server's warm-up at that concurrency (perf.py runs the same
    requests every round), so it is kept in ``per_round`` but not in the medians, unless it is the only one."""
    return values[1:] or values


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def language_of(doc: dict, drafter: str | None = None) -> str:
    """The language a result ran (synth_lang's SYNTH_LANG: phrases, pairs, code, prose): the result's own
    ``language`` (perf.py, autotune_real.py and profile_step.py record it), else read from the drafter's name
    (``tiny-pairs-...``, ``tiny-code-...``, ``tiny-prose-...``), else ``phrases`` (results from before the
    field, the default language)."""
    if doc.get("language"):
        return doc["language"]
    name = drafter or doc.get("drafter") or ""
    return next((kind for kind in ("pairs", "code", "prose") if "-%s-" % kind in name), "phrases")


def _head(
    doc: dict,
    shape: str | None = None,
    layers: int | None = None,
    drafter: str | None = None,
    gpu: str | None = None,
    language: str | None = None,
) -> dict:
    """What a result's rows measured: the shape, its layers and TP (from the run's target, ``SHAPES``, unless
    given), the GPU, the drafter and the language (from the result, unless given)."""
    target = doc.get("target", "tiny")
    default_shape, default_layers, tp = SHAPES.get(target, (target, None, 1))
    return {
        "shape": shape or default_shape,
        "layers": layers or default_layers,
        "tp": tp,
        "gpu": gpu or doc.get("gpu"),
        "drafter": drafter or doc.get("drafter") or "the shape's",
        "language": language or language_of(doc, drafter),
    }


def rows_from_perf(doc: dict, commit: str, source: str, **names) -> list[dict]:
    """The scoreboard rows of one perf.py result (``results-perf.json``); ``names`` as for _head."""
    head = _head(doc, **names)
    runs = doc.get("runs", [])
    servers = doc.get("servers", {})
    ddtree = [name for name, info in servers.items() if info.get("algorithm") == "DDTREE"]
    out = []
    for name in ddtree:
        info = servers[name]
        for concurrency in sorted({r["concurrency"] for r in runs if r.get("server") == name}):
            dflash = _by(runs, "perf-dflash", concurrency, "tokens_per_s")
            mine = _by(runs, name, concurrency, "tokens_per_s")
            per_round = [round(a / b, 3) for a, b in zip(mine, dflash) if a and b]
            warm = _warm(per_round)
            out.append(
                {
                    **head,
                    "tp": info.get("tp", head["tp"]),
                    "accept_dflash": _median(_by(runs, "perf-dflash", concurrency, "mean_accept")),
                    "accept_ddtree": _median(_by(runs, name, concurrency, "mean_accept")),
                    "ddtree_setting": info.get("ddtree_setting")
                    or _flag(info.get("flags", []), "--speculative-ddtree-budget"),
                    "top_k": _flag(info.get("flags", []), "--speculative-ddtree-top-k") or "auto",
                    "concurrency": concurrency,
                    "new_tokens": doc.get("new_tokens"),
                    "tokens_per_s": {
                        "NONE": _median(_warm(_by(runs, "perf-none", concurrency, "tokens_per_s"))),
                        "DFLASH": _median(_warm(dflash)),
                        "DDTREE": _median(_warm(mine)),
                    },
                    "ddtree_over_dflash": _median(warm),
                    **_step_ms(runs, name, concurrency),
                    "per_round": per_round,
                    "rounds": len(per_round),
                    "warm_up_round": "excluded" if len(warm) < len(per_round) else "none",
                    "errors": [r.get("error") for r in runs if r.get("server") == name and r.get("error")][:3],
                    "commit": commit,
                    "source": source,
                }
            )
    return out


def budget_at(budget, concurrency: int) -> int:
    """The budget a setting (a budget or a schedule, as ddtree_budget.parse_budget takes it) verifies with at
    `concurrency` requests: the first schedule entry whose batch size covers it, the last one above them all."""
    parsed = parse_budget(budget)
    if isinstance(parsed, int):
        return parsed
    return next((b for batch, b in parsed if concurrency <= batch), parsed[-1][1])


def rows_from_autotune(doc: dict, commit: str, source: str, **names) -> list[dict]:
    """The scoreboard rows of one autotune_real.py result: one per DDTREE setting of the grid and concurrency,
    from the measurements the collection's choice decided on (tokens/s the median of all rounds: each level's
    unmeasured warm-up requests come before its first round, so no round is left out). ``chosen`` marks the
    rows whose budget the chosen setting runs at that concurrency, and ``autotune_choice`` names that setting.
    ``names`` as for _head."""
    head = _head(doc, **names)
    measured = doc.get("measurements", [])
    choice = doc.get("choice") or {}
    chose_ddtree = choice.get("algorithm") == "DDTREE"

    def of(algorithm: str, concurrency: int, budget=None, top_k=None) -> dict:
        return next(
            (
                m
                for m in measured
                if (m["algorithm"], m["concurrency"], m.get("budget"), m.get("top_k"))
                == (algorithm, concurrency, budget, top_k)
            ),
            {},
        )

    out = []
    for m in measured:
        if m["algorithm"] != "DDTREE":
            continue
        concurrency = m["concurrency"]
        dflash, none = of("DFLASH", concurrency), of("NONE", concurrency)
        per_round = [round(a / b, 3) for a, b in zip(m.get("rounds") or [], dflash.get("rounds") or []) if a and b]
        chosen = (
            chose_ddtree
            and choice.get("top_k") == m.get("top_k")
            and budget_at(choice["budget"], concurrency) == m["budget"]
        )
        out.append(
            {
                **head,
                "accept_dflash": dflash.get("accept_length"),
                "accept_ddtree": m.get("accept_length"),
                "ddtree_setting": str(m["budget"]),
                "top_k": str(m.get("top_k") or "auto"),
                "concurrency": concurrency,
                "new_tokens": doc.get("max_tokens"),
                "tokens_per_s": {
                    "NONE": none.get("tokens_per_second"),
                    "DFLASH": dflash.get("tokens_per_second"),
                    "DDTREE": m.get("tokens_per_second"),
                },
                "ddtree_over_dflash": _median(per_round),
                "per_round": per_round,
                "rounds": len(per_round),
                "warm_up_round": "none",
                "errors": [e for e in (m.get("error"), dflash.get("error")) if e],
                "autotune_choice": format_choice(choice),
                "chosen": bool(chosen),
                "commit": commit,
                "source": source,
            }
        )
    return out


def format_choice(choice: dict) -> str | None:
    """The chosen setting in a row's words: ``DDTREE 1:31,16:31,64:15 top_k 8``, or ``DFLASH``."""
    if not choice:
        return None
    if choice.get("algorithm") != "DDTREE":
        return choice.get("algorithm")
    return "DDTREE %s top_k %s" % (choice["budget"], choice.get("top_k"))


def _step_ms(runs: list[dict], name: str, concurrency: int) -> dict:
    """``step_ms`` of a streamed run (perf.py's ``PERF_STREAM=1``): the decode step of every server, medians of
    the rounds after the warm-up; nothing for a run that was not streamed."""
    steps = {
        algorithm: _median(_warm(_by(runs, server, concurrency, "step_ms")))
        for algorithm, server in (("NONE", "perf-none"), ("DFLASH", "perf-dflash"), ("DDTREE", name))
    }
    return {"step_ms": steps} if any(v is not None for v in steps.values()) else {}


def _flag(flags: list, name: str) -> str | None:
    return flags[flags.index(name) + 1] if name in flags else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("commit")
    parser.add_argument(
        "--scoreboard",
        default=os.path.join(
            os.path.dirname(__file__), "..", "..", "docs", "evidence", "gpu-sglang", "scoreboard.json"
        ),
    )
    parser.add_argument("--shape")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--drafter")
    parser.add_argument("--language", help="the language, for a result that does not record it (perf.py's `language`)")
    parser.add_argument("--gpu", help="the GPU's name, for a result that does not record it (perf.py's `gpu`)")
    parser.add_argument("--source", help="the evidence file the rows come from (default: the results path)")
    args = parser.parse_args()
    with open(args.results, encoding="utf-8") as fh:
        doc = json.load(fh)
    source = args.source or os.path.basename(args.results)
    rows_from = rows_from_autotune if doc.get("plan") == "autotune" else rows_from_perf
    names = {
        "shape": args.shape,
        "layers": args.layers,
        "drafter": args.drafter,
        "gpu": args.gpu,
        "language": args.language,
    }
    rows = rows_from(doc, args.commit, source, **names)
    board = {"rows": []}
    if os.path.exists(args.scoreboard):
        with open(args.scoreboard, encoding="utf-8") as fh:
            board = json.load(fh)
    board["rows"] = [r for r in board["rows"] if (r.get("source"), r.get("commit")) != (source, args.commit)] + rows
    with open(args.scoreboard, "w", encoding="utf-8") as fh:
        json.dump(board, fh, indent=1)
        fh.write("\n")
    print(
        "| shape | drafter | setting | c | accept DFLASH / DDTREE | NONE | DFLASH | DDTREE | DDTREE/DFLASH (rounds) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        t = r["tokens_per_s"]
        print(
            "| %s | %s | %s | %d | %s / %s | %s | %s | %s | %s (%s) |"
            % (
                r["shape"],
                r["drafter"],
                r["ddtree_setting"],
                r["concurrency"],
                r["accept_dflash"],
                r["accept_ddtree"],
                t["NONE"],
                t["DFLASH"],
                t["DDTREE"],
                r["ddtree_over_dflash"],
                ", ".join(str(x) for x in r["per_round"]),
            )
        )


if __name__ == "__main__":
    main()
