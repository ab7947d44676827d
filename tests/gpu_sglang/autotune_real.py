"""The autotune grid measured and chosen on the device, with real SGLang 0.5.23 servers.

Usage (on the device, after device-setup.sh): python autotune_real.py OUT MODELS DRAFTER [ROUNDS]
  DRAFTER: the drafter's directory under MODELS (tiny-qwen3-dflash: the harness's trained drafter;
  another name: one train_models.py --drafter-only or --drafter-levels wrote, or a level of an embedded bed).
Usage (anywhere): python autotune_real.py --choose RESULTS OUT
  the measurements and choice of a RESULTS file whose process was stopped before it decided, from its
  runs, written to OUT.

What the collection does on a host, with the collection's own code, the servers started here instead of
as the role's temporary units: the declaration (`declaration_from_env`: a service's `autotune: {}`, the
collection's default grid, unless the knobs below replace a field) is validated by
autotune.autotune_problems, every setting of autotune.candidate_settings (DFLASH and each DDTREE budget x
top_k) plus NONE is a server (scenario.py's flags, CUDA graphs on), each is measured by
autotune_measure.measure_setting through the health gate's own HTTP client (health_gate.ServiceIO.request),
and autotune.choose decides. Differences from the role, and why: the servers share one GPU (the role starts
one at a time on spare GPUs), NONE first and alone (it fills the JIT cache the others read), then the rest
AUTOTUNE_AT_ONCE at a time, each group measured one server at a time while the others idle, and stopped
before the next group starts (scenario.in_groups: a group that would not end before the call does, at the
pace of the group before it, is not started, and however the process ends, the settings measured in every
round decide); the prompts are the harness's held-out prompts of the synthetic language the
tiny target speaks (the collection's English prompt set would be unknown words to its word-level
tokenizer), perf.CONCURRENCY's count of them at each level; ROUNDS rounds (default 3), each setting's
tokens/s the median of its rounds (autotune.choose takes one measurement per setting: "give one per
setting, e.g. the median of repeats"). Writes OUT/results-autotune-DRAFTER.json; prints the grid, the
choice and its gains.
Knobs (environment):
  AUTOTUNE_BUDGETS, AUTOTUNE_TOP_K, AUTOTUNE_CONCURRENCY  comma lists in place of the default grid's field
  AUTOTUNE_TARGET     scenario.SHAPES' target (default tiny; embedded-qwen3-8b: MODELS is the embedded bed)
  AUTOTUNE_NEW_TOKENS new tokens a request (default 64, ignore_eos)
  AUTOTUNE_REPEAT     each level's prompt list sent N times (default 1; longer levels average out jitter)
  AUTOTUNE_AT_ONCE    servers up at once after NONE (default 0: all; production-shaped targets need fewer)
"""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import perf  # noqa: E402
import scenario as sc  # noqa: E402
import synth_lang as sl  # noqa: E402

# The collection as Ansible imports it (collections/ansible_collections/ddtree/sglang -> the checkout).
sys.path.insert(0, os.path.join(REPO, "collections"))
from ansible_collections.ddtree.sglang.plugins.module_utils import autotune  # noqa: E402
from ansible_collections.ddtree.sglang.plugins.module_utils.autotune_measure import measure_setting  # noqa: E402
from ansible_collections.ddtree.sglang.plugins.module_utils.health_gate import ServiceIO  # noqa: E402

GRID_KNOBS = (("budgets", "AUTOTUNE_BUDGETS"), ("top_k", "AUTOTUNE_TOP_K"), ("concurrency", "AUTOTUNE_CONCURRENCY"))


def declaration_from_env(env=None):
    """The service's `autotune` declaration this run measures: {} (the collection's default grid) with each
    knob of GRID_KNOBS that is set in `env` (default: this process's environment), a comma list of integers,
    in place of its field."""
    env = os.environ if env is None else env
    spec = {}
    for field, knob in GRID_KNOBS:
        if env.get(knob):
            try:
                spec[field] = [int(item) for item in env[knob].split(",")]
            except ValueError:
                raise SystemExit("%s=%r: give a comma list of integers, e.g. 7,15,31" % (knob, env[knob])) from None
    return spec


def level_prompts(prompts, concurrency, repeat):
    """The requests of one level: perf.CONCURRENCY's count of prompts at that concurrency (four per
    concurrent request for a level it does not list), `repeat` times."""
    return prompts[: perf.CONCURRENCY.get(concurrency, 4 * concurrency)] * repeat


def server_name(item):
    """The name of the server that runs one setting (its log is server-NAME.log)."""
    return "autotune-" + autotune.setting_name(item).lower().replace(" ", "-").replace("_", "")


def server_for(item, port, out, models, drafter, shape):
    """A scenario.Server running one setting on the target `shape`, with DRAFTER as its drafter."""
    spec = {"drafter": drafter}
    if item["algorithm"] == "DDTREE":
        spec.update(budget=item["budget"], top_k=item["top_k"])
    return sc.Server(server_name(item), item["algorithm"], sc.RELEASE, port, out, models, shape=shape, **spec)


def median(values):
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else None


def grid_settings(tuning):
    """Every setting the run measures: NONE, then autotune.candidate_settings (DFLASH and each DDTREE)."""
    return [autotune.setting("NONE")] + autotune.candidate_settings(tuning)


def not_started_reason(info):
    """Why a server has no runs, from its info: skipped before the call's end, failed, or cut off."""
    if info.get("skipped"):
        return info["skipped"]
    if info.get("error"):
        return "the server did not start (%s)" % info["error"]
    return "the call ended before it was measured"


def measurements_from(doc, settings):
    """One measurement per setting and concurrency of doc["tuning"]: the median of the setting's runs in
    doc["runs"]. A setting that failed in any round keeps that failure, and one measured in fewer than
    doc["rounds"] rounds (the call ended) is marked unmeasured: autotune.choose never picks either."""
    measurements = []
    for item in settings:
        info = doc["servers"].get(server_name(item), {})
        for concurrency in doc["tuning"]["concurrency"]:
            runs = [
                run
                for run in doc["runs"]
                if run["algorithm"] == item["algorithm"]
                and run["budget"] == item["budget"]
                and run["top_k"] == item["top_k"]
                and run["concurrency"] == concurrency
            ]
            failed = [run for run in runs if run["error"] or run["tokens_per_second"] is None]
            measurement = dict(
                item,
                concurrency=concurrency,
                tokens_per_second=None,
                accept_length=None,
                rounds=[run["tokens_per_second"] for run in runs],
            )
            if not runs:
                measurement["error"] = "not measured: %s" % not_started_reason(info)
            elif failed:
                measurement["error"] = failed[0]["error"] or "no tokens/s"
            elif len(runs) < doc["rounds"]:
                measurement["error"] = "not measured: %d of %d rounds before the call ended" % (
                    len(runs),
                    doc["rounds"],
                )
            else:
                measurement["tokens_per_second"] = median([run["tokens_per_second"] for run in runs])
                measurement["accept_length"] = median([run["accept_length"] for run in runs if run["accept_length"]])
                measurement["error"] = None
            measurements.append(measurement)
    return measurements


def decide(doc):
    """doc with its measurements and autotune.choose's choice over them (settings of the grid left
    unmeasured are candidates that failed), from its tuning and runs alone."""
    tuning = doc["tuning"]
    doc["measurements"] = measurements_from(doc, grid_settings(tuning))
    try:
        doc["choice"] = autotune.choose(tuning, doc["measurements"])
    except autotune.IncompleteMeasurements as exc:
        doc["choice"] = {"error": str(exc)}
    return doc


def choose_from_file(results, out):
    """--choose: decide() over a results file's runs; the document says that it was decided afterwards."""
    with open(results) as fh:
        doc = decide(json.load(fh))
    doc["decided"] = "after the call, from its runs: autotune_real.py --choose"
    with open(out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print_report(doc, doc["tuning"])


def main():
    if sys.argv[1] == "--choose":
        return choose_from_file(sys.argv[2], sys.argv[3])
    sc.exit_on_sigterm()
    out, models, drafter = sys.argv[1], sys.argv[2], sys.argv[3]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    shape = os.environ.get("AUTOTUNE_TARGET", "tiny")
    new_tokens = int(os.environ.get("AUTOTUNE_NEW_TOKENS", "64"))
    repeat = int(os.environ.get("AUTOTUNE_REPEAT", "1"))
    at_once = int(os.environ.get("AUTOTUNE_AT_ONCE", "0"))
    declared = declaration_from_env()
    problems = autotune.autotune_problems({"algorithm": "DDTREE", "autotune": declared})
    if problems:
        sys.exit("the declaration is invalid: %s" % problems)
    tuning = autotune.declaration({"autotune": declared})
    settings = grid_settings(tuning)
    servers = [
        (item, server_for(item, 30200 + index, out, models, drafter, shape)) for index, item in enumerate(settings)
    ]
    lang = sl.Language()
    prompts = lang.greedy_prompts()
    t0 = time.time()
    doc = {
        "plan": "autotune",
        "target": shape,
        "language": lang.kind,
        "gpu": perf.gpu_name(),
        "drafter": drafter,
        "declaration": declared,
        "tuning": tuning,
        "rounds": rounds,
        "max_tokens": new_tokens,
        "prompts": "harness held-out greedy prompts (%d)" % len(prompts),
        "requests": {c: len(level_prompts(prompts, c, repeat)) for c in tuning["concurrency"]},
        "at_once": at_once,
        "servers": {},
        "runs": [],
    }
    path = os.path.join(out, "results-autotune-%s.json" % drafter)

    def save():
        doc["seconds"] = round(time.time() - t0, 1)
        doc["servers"] = {server.name: server.info for _item, server in servers}
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=1)

    item_of = {server.name: item for item, server in servers}

    def measure_group(ready):
        """ROUNDS rounds over the group's ready servers, each measured at every level while the others idle."""
        for number in range(rounds):
            for server in ready:
                item = item_of[server.name]
                io = ServiceIO(None, None, None, server.name, "127.0.0.1", server.port)
                for index, concurrency in enumerate(tuning["concurrency"]):
                    for level in measure_setting(
                        io.request,
                        item,
                        [concurrency],
                        level_prompts(prompts, concurrency, repeat),
                        new_tokens,
                        timeout=120.0,
                        warmup=1 if number == 0 and index == 0 else 0,
                    ):
                        doc["runs"].append(dict(level, round=number))
                        print(
                            "[autotune] round %d %s c%d %s tok/s accept %s %s"
                            % (
                                number,
                                autotune.setting_name(item),
                                level["concurrency"],
                                level["tokens_per_second"],
                                level["accept_length"],
                                level["error"] or "",
                            ),
                            flush=True,
                        )
            save()

    try:
        groups = perf.server_groups([server for _item, server in servers], at_once)
        sc.in_groups(groups, measure_group, sc.call_deadline(), "autotune", limit=400)
    finally:
        for _item, server in servers:
            server.stop()
        for _item, server in servers:
            try:
                log = open(os.path.join(out, "server-%s.log" % server.name)).read()
                server.info.update(sc.decode_graph_counts(log))
            except OSError:
                pass
        # Also when the call's end stops this process: the settings measured in every round still decide.
        decide(doc)
        save()
    print_report(doc, tuning)
    print("[autotune] done in %.0f s" % (time.time() - t0), flush=True)


def fmt(value):
    return "%.0f" % value if isinstance(value, (int, float)) else str(value)


def print_report(doc, tuning):
    by = {(m["algorithm"], m["budget"], m["top_k"], m["concurrency"]): m for m in doc["measurements"]}
    concs = tuning["concurrency"]
    print("| setting | " + " | ".join("c%d tok/s (rounds) | accept | vs DFLASH" % c for c in concs) + " |")
    print("| --- |" + " --- | --- | --- |" * len(concs))
    for key in sorted(
        {(m["algorithm"], m["budget"], m["top_k"]) for m in doc["measurements"]},
        key=lambda k: (k[0] != "NONE", k[0] != "DFLASH", k[1] or 0, k[2] or 0),
    ):
        cells = []
        for c in concs:
            m, d = by[key + (c,)], by[("DFLASH", None, None, c)]
            ratio = (
                (m["tokens_per_second"] / d["tokens_per_second"])
                if m["tokens_per_second"] and d["tokens_per_second"]
                else None
            )
            cells.append(
                "%s (%s) | %s | %s"
                % (
                    fmt(m["tokens_per_second"]),
                    ", ".join(fmt(r) for r in m["rounds"]),
                    m["accept_length"],
                    ("%.3f" % ratio) if ratio else m.get("error"),
                )
            )
        print(
            "| %s | %s |"
            % (autotune.setting_name({"algorithm": key[0], "budget": key[1], "top_k": key[2]}), " | ".join(cells))
        )
    choice = doc["choice"]
    shown = (
        "algorithm",
        "budget",
        "top_k",
        "status",
        "tokens_per_second",
        "gain_over_dflash",
        "gain_over_none",
        "error",
    )
    print("[autotune] choice: %s" % {key: choice.get(key) for key in shown})
    print("[autotune] reason: %s" % choice.get("reason"))


if __name__ == "__main__":
    main()
