"""Tokens/s of NONE, DFLASH and DDTREE before and after a change, in one run.

Usage (on the device, after device-setup.sh): python perf.py OUT MODELS [ROUNDS]
All servers take scenario.py's flags (CUDA graphs on for every one); they differ only in the algorithm
and, for `ddtree-before`, the environment PERF_BEFORE_ENV names (default DDTREE_EAGER_TREE_STAGE=1: the
tree stage runs eagerly every step instead of from its CUDA graphs; DDTREE_EAGER_TREE_VERIFY=1 runs the
tree verify outside the target's graphs as well; several as A=1,B=0; `none`: no
`ddtree-before` server, three servers only); PERF_AFTER_ENV likewise for `ddtree` (default none), for
a change that is still an opt-in switch.
PERF_TARGET picks the target (scenario.SHAPES): `tiny` (default; MODELS holds the tiny pair) or
`qwen3-8b` (MODELS holds make_shaped.py's configs; random weights, random drafter: equal acceptance).
PERF_DDTREE="15;63;1:63,4:31,16:15,48:7" measures one DDTREE server per budget or schedule instead of the
before/after pair (names perf-ddtree-<i>; PERF_TOP_K sets their top-k, default the overlay's for the budget);
PERF_DRAFTER names the drafter directory under MODELS for every speculative server (default the shape's).
PERF_STEP_TIMING=N sets DDTREE_STEP_TIMING=N on both DDTREE servers (host ms per part of the tree step,
logged every N steps; the last lines land in results-perf.json). NONE starts first (it
fills the JIT cache), then the others together (all at once without NONE); then the measurements run one server
at a time (the others idle), ROUNDS rounds (default 3) of 1, 16 and 64 concurrent greedy requests (T = 0,
PERF_NEW_TOKENS new tokens, default scenario.GREEDY_NEW = 64, ignore_eos; longer outputs weigh the decode steps
more and each request's fixed cost, its prefill and HTTP round trip, less) on the held-out prompts: 6, 32 and 64
requests, each list PERF_REPEAT times (default 1; longer rounds average out the scheduler's jitter, which moves a
0.1 s round by 20 %). tokens/s = completion tokens / wall
seconds of the round. Greedy outputs of the first round are kept to compare servers (graphs vs eager).
PERF_ONE_AT_A_TIME=1: each server is started, measured for every round and stopped before the next starts (a
shape whose weights leave room for one server, e.g. qwen3-30b-a3b's 61 GB; a round's servers are then minutes
apart instead of seconds); a server that would not end before CALL_DEADLINE (epoch seconds, set by
device-run.sh from CALL_LIMIT) at the pace of the one before it is not started, and its entry says so. PERF_NONE=0: no NONE server.
PERF_STREAM=1: requests are streamed, and each run also records the medians of the first chunk's latency
(`first_chunk_s`: queueing and prefill, paid once a request by every algorithm) and of the gap between later
chunks (`step_ms`: one decode step, SGLang streaming each step's tokens), so DFLASH's and DDTREE's steps compare
without the fixed costs that tokens/s of short outputs include.
Writes OUT/results-perf.json and OUT/server-perf-NAME.log.
"""

import concurrent.futures as cf
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenario as sc  # noqa: E402
import synth_lang as sl  # noqa: E402

CONCURRENCY = {1: 6, 16: 32, 64: 64}  # concurrent requests -> requests per measurement
NEW_TOKENS = int(os.environ.get("PERF_NEW_TOKENS") or sc.GREEDY_NEW)


def measure(server, prompts, conc):
    params = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    repeat = int(os.environ.get("PERF_REPEAT", "1"))
    jobs = prompts[: CONCURRENCY[conc]] * repeat
    t = time.time()
    stream = os.environ.get("PERF_STREAM") == "1"
    with cf.ThreadPoolExecutor(conc) as ex:
        outs = list(ex.map(lambda p: server.generate(p, params, stream=stream), jobs))
    secs = time.time() - t
    tokens = sum(o["completion_tokens"] or 0 for o in outs)
    acc = [o["accept"] for o in outs if o["accept"] is not None]
    result = {
        "tokens": tokens,
        "seconds": round(secs, 3),
        "tokens_per_s": round(tokens / secs, 1),
        "mean_accept": (sum(acc) / len(acc)) if acc else None,
    }
    if stream:
        result.update(stream_summary(outs))
    return result, [o["ids"] for o in outs]


def middle(values):
    """The middle value (the upper one of an even count), None for no values: the medians this script prints."""
    values = sorted(values)
    return values[len(values) // 2] if values else None


def stream_summary(outs):
    """Medians over a round's streamed requests: the first chunk's latency and the decode step's length."""
    return {key: middle(o[key] for o in outs if o.get(key) is not None) for key in ("first_chunk_s", "step_ms")}


def per_server(runs, key):
    """(server, concurrency) -> the runs' values of `key`, in run order (runs without it left out)."""
    values = {}
    for run in runs:
        if run.get(key) is not None:
            values.setdefault((run["server"], run["concurrency"]), []).append(run[key])
    return values


def gpu_name():
    """The first GPU's name as nvidia-smi reports it (the scoreboard's ``gpu``), None without nvidia-smi."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.splitlines()[0].strip() if out.stdout.strip() else None


def server_groups(servers, at_once=0):
    """The servers in start order: NONE alone first when it leads (it fills the JIT cache the others then
    read), then the rest `at_once` at a time, or all together when `at_once` is 0 (their start-ups, graph
    captures of a minute or more each, overlap)."""
    first, rest = ([servers[0]], servers[1:]) if servers and servers[0].algo == "NONE" else ([], servers)
    size = at_once if at_once > 0 else max(len(rest), 1)
    return ([first] if first else []) + [rest[i : i + size] for i in range(0, len(rest), size)]


def start_servers(servers):
    """Every server up: each group of server_groups started together and ready before the next starts.
    Returns the ready ones."""
    return [s for group in server_groups(servers) for s in sc.start_group(group)]


def main():
    sc.exit_on_sigterm()
    out, models = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    lang = sl.Language()
    prompts = lang.greedy_prompts()
    shape = os.environ.get("PERF_TARGET", "tiny")
    before_env = os.environ.get("PERF_BEFORE_ENV", "DDTREE_EAGER_TREE_STAGE=1")
    drafter = os.environ.get("PERF_DRAFTER") or None
    servers = [
        sc.Server("perf-none", "NONE", sc.RELEASE, 30100, out, models, shape=shape),
        sc.Server("perf-dflash", "DFLASH", sc.RELEASE, 30101, out, models, shape=shape, drafter=drafter),
    ]
    if os.environ.get("PERF_NONE") == "0":
        servers = servers[1:]
    one_at_a_time = os.environ.get("PERF_ONE_AT_A_TIME") == "1"
    settings = [item.strip() for item in os.environ.get("PERF_DDTREE", "").split(";") if item.strip()]
    if settings:
        top_k = int(os.environ["PERF_TOP_K"]) if os.environ.get("PERF_TOP_K") else None
        for i, budget in enumerate(settings):
            server = sc.Server(
                "perf-ddtree-%d" % i,
                "DDTREE",
                sc.RELEASE,
                30102 + i,
                out,
                models,
                shape=shape,
                drafter=drafter,
                budget=budget,
                top_k=top_k,
            )
            server.info["ddtree_setting"] = budget
            servers.append(server)
    else:
        if before_env != "none":
            before = sc.Server(
                "perf-ddtree-before", "DDTREE", sc.RELEASE, 30102, out, models, shape=shape, drafter=drafter
            )
            before.set_env(before_env)
            servers.append(before)
        after = sc.Server("perf-ddtree", "DDTREE", sc.RELEASE, 30103, out, models, shape=shape, drafter=drafter)
        # PERF_AFTER_ENV: the change measured is an opt-in switch (e.g. DDTREE_IN_PLACE_TREE_MASK=1).
        if os.environ.get("PERF_AFTER_ENV", "none") != "none":
            after.set_env(os.environ["PERF_AFTER_ENV"])
        servers.append(after)
    ddtree = [s for s in servers if s.algo == "DDTREE"]
    if os.environ.get("PERF_STEP_TIMING"):
        for s in ddtree:
            s.env["DDTREE_STEP_TIMING"] = os.environ["PERF_STEP_TIMING"]
    t0 = time.time()
    doc = {
        "plan": "perf",
        "target": shape,
        "language": lang.kind,
        "gpu": gpu_name(),
        "drafter": drafter,
        "rounds": rounds,
        "requests": CONCURRENCY,
        "new_tokens": NEW_TOKENS,
        "repeat": int(os.environ.get("PERF_REPEAT", "1")),
        "servers": {s.name: s.info for s in servers},
        "runs": [],
        "outputs": {},
    }

    def save():
        doc["seconds"] = round(time.time() - t0, 1)
        with open(os.path.join(out, "results-perf.json"), "w") as fh:
            json.dump(doc, fh)

    def measure_rounds(group, r):
        for s in group:
            for conc in CONCURRENCY:
                try:
                    m, ids = measure(s, prompts, conc)
                except Exception as e:  # noqa: BLE001 (recorded; the other servers still run)
                    m, ids = {"error": repr(e)}, None
                doc["runs"].append(dict(m, round=r, server=s.name, concurrency=conc))
                if r == 0 and ids is not None and conc in (1, 16):
                    doc["outputs"]["%s/c%d" % (s.name, conc)] = ids
                print("[perf] round %d %s c%d %s" % (r, s.name, conc, m), flush=True)
            save()

    try:
        if one_at_a_time:

            def measure_server(s):
                for r in range(rounds):
                    measure_rounds([s], r)

            sc.one_at_a_time(servers, measure_server, sc.call_deadline(), "perf")
        else:
            ready = start_servers(servers)
            print("[perf] ready: %s after %.0f s" % ([s.name for s in ready], time.time() - t0), flush=True)
            for r in range(rounds):
                measure_rounds(ready, r)
    finally:
        for s in servers:
            s.stop()
        for s in servers:
            try:
                log = open(os.path.join(out, "server-%s.log" % s.name)).read()
                s.info.update(sc.decode_graph_counts(log))
                s.info["ddtree_ready_line"] = (re.findall(r"DDTREE worker ready[^\n]*", log) or [None])[0]
                s.info["ddtree_graph_line"] = re.findall(r"DDTREE tree verify[^\n]*", log) or None
                s.info["ddtree_errors"] = re.findall(r"(?:Traceback|Error|error)[^\n]*", log)[-12:]
                s.info["step_timing"] = re.findall(r"DDTREE step timing[^\n]*", log)[-40:]
            except OSError:
                pass
        save()
    print_table(doc)
    for s in ddtree:
        print("[perf] %s: %s; %s" % (s.name, s.info.get("ddtree_graph_line"), s.info.get("env", "")))
        for line in s.info.get("step_timing") or []:
            print("[perf] %s %s" % (s.name, line))
    print("[perf] done in %.0f s" % (time.time() - t0), flush=True)


def print_table(doc):
    """Median tokens/s per server and concurrency, DDTREE / DFLASH ratios, greedy agreement."""
    by = per_server(doc["runs"], "tokens_per_s")
    med = {k: middle(v) for k, v in by.items()}
    acc = {}
    for run in doc["runs"]:
        if run.get("mean_accept") is not None:
            acc.setdefault(run["server"], []).append(run["mean_accept"])
    print("| server | " + " | ".join("c%d tok/s (runs)" % c for c in CONCURRENCY) + " | accept len |")
    print("| --- |" + " --- |" * (len(CONCURRENCY) + 1))
    for name in doc["servers"]:
        cells = [
            "%s (%s)" % (med.get((name, c)), ", ".join(str(x) for x in by.get((name, c), []))) for c in CONCURRENCY
        ]
        a = acc.get(name)
        print("| %s | %s | %s |" % (name, " | ".join(cells), ("%.2f" % (sum(a) / len(a))) if a else "-"))
    for (name, c), values in sorted(per_server(doc["runs"], "step_ms").items()):
        print("%s c%d: decode step %.2f ms (medians of rounds: %s)" % (name, c, middle(values), values))
    for name in [n for n in doc["servers"] if n.startswith("perf-ddtree")]:
        for c in CONCURRENCY:
            d, t = med.get(("perf-dflash", c)), med.get((name, c))
            if d and t:
                runs = [round(x / y, 3) for x, y in zip(by[(name, c)], by[("perf-dflash", c)])]
                print("%s / DFLASH at c%d: %.3f (per round %s)" % (name, c, t / d, runs))
    # Greedy agreement against the DDTREE "before" server, else against DFLASH (three-server runs).
    outs = doc["outputs"]
    ref_name = next(n for n in ("perf-ddtree-before", "perf-none", "perf-dflash") if n in doc["servers"])
    for c in (1, 16):
        ref = outs.get("%s/c%d" % (ref_name, c))
        for name in [n for n in doc["servers"] if n != ref_name]:
            got = outs.get("%s/c%d" % (name, c))
            if ref is not None and got is not None:
                same = sum(1 for a, b in zip(ref, got) if a == b)
                print("greedy c%d: %s == %s on %d of %d prompts" % (c, name, ref_name[5:], same, len(ref)))


if __name__ == "__main__":
    main()
