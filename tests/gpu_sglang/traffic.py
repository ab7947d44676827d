"""Real traffic: DDTREE lossless and stable under what users' servers see (device-run.sh step `traffic`).

Usage (on the device, after device-setup.sh): python traffic.py OUT MODELS
        python traffic.py --analyze RESULTS_JSON MODELS   (here or there: the checks again from saved outputs)

Four servers of the tiny trained pair start together, each with the radix cache on (its pure-Python TreeCore:
scenario.RADIX_ENV), chunked prefill (--chunked-prefill-size 2048) and a 20480-token context (the target's
config says 2048: SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1), each with its own --random-seed: NONE, DDTREE
(budget 15, top-k 8), DDTREE with the schedule "1:31,16:15" (top-k 8) and the control release's DDTREE (the
planted lossy sampled walk, budget 15). Every server but the control runs the five phases below in order, all
four at once; the control runs the mixed batch only. Prompts are token ids (`input_ids`), built from the
language with fixed seeds (build_workload), so their lengths are exact and the host rebuilds them.

  radix     a common prefix of PREFIX_LEN tokens + distinct suffixes, 8 one after another, then 16 at once;
            greedy, 64 new tokens. Asserts meta_info.cached_tokens >= PREFIX_LEN - RADIX_SLACK for every
            request but the first, and DDTREE's tokens == NONE's.
  chunked   prompts of 4096..16000 tokens, one at a time then all at once; greedy, 64 new tokens. Asserts
            prompt_tokens, that no logged prefill batch took more than 2048 new tokens, and DDTREE == NONE.
  mixed     one batch: greedy requests (T = 0, short and long-prefix prompts) among sampled ones at three
            settings (SETTINGS: T/top-p/top-k), on the branch prompts and on the prefix + branch prompts, 48 at
            once. Greedy: DDTREE == NONE. Sampled, per setting, over (prompt, t1, t2) (t1 comes from the prefill,
            t2 is the first token produced through the tree verify, the one the planted walk makes the argmax):
            a chi-square test of homogeneity against NONE's samples and a goodness of fit against the target's
            exact distribution under that setting (fp32, Hugging Face, same weights: ExactTarget). DDTREE must
            pass both (p >= ALPHA), the control must be rejected by both (p < ALPHA), NONE must pass the fit.
  stream    the radix and chunked prompts again with stream=True, one at a time: each chunk's ids extend the
            previous chunk's, the last equals the server's own non-streamed output, DDTREE == NONE.
  abort     8 greedy "witness" requests (prefix prompts, 128 new tokens) alone, then again while 8 streamed
            victims (16384 new tokens; 4 greedy, 4 at T = 1) are cut after 3 chunks, 4 by closing the connection
            and 4 by POST /abort_request with their rid, then once more. Asserts the rid-aborted ones finish with
            finish_reason abort, the server goes idle (/v1/loads: no running or waiting request, num_used_tokens
            0: no KV held outside the evictable cache), /health is 200, /flush_cache succeeds, the log has no
            leak message, and the witnesses' outputs are the same all three times and equal NONE's.

Greedy identity: a difference passes only where the target's fp32 log-probabilities of the two tokens at the
first differing position are both within NEAR_TIE_NATS of its best (bf16 kernels or batch shapes may pick
either of a near-tie); every difference is listed with its prompt, position and tokens. Writes
OUT/results-traffic.json (raw outputs, then each check's verdict and evidence) and prints a short summary.
TRAFFIC_LIMIT_S (default 420) bounds the step; a phase that would not fit is skipped and its check fails.
"""

import concurrent.futures as cf
import json
import math
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenario  # noqa: E402
import synth_lang as sl  # noqa: E402

ALPHA = 0.001
PREFIX_LEN = 2560
RADIX_SLACK = 16  # cached_tokens may stop short of the prefix by a page or the last token; page size is 1 here
CHUNK = 2048
CONTEXT = 20480
CHUNK_LENGTHS = (4096, 6144, 8192, 10240, 12288, 16000)
GREEDY_NEW = 64
SAMPLED_NEW = 5
SHORT_SAMPLES = 48  # per (branch prompt, setting)
LONG_SAMPLES = 32  # per (prefix + branch prompt, setting)
WITNESS_NEW = 128
VICTIM_NEW = 20000  # a victim left running would hold the server busy for 20 s or more (DDTREE ~9 ms a step)
ABORT_IDLE_S = 8  # the server idle this soon after the witnesses (SGLang aborts a closed stream after 2 s)
VICTIM_CHUNKS = 3
NEAR_TIE_NATS = 0.1
BOUNDARY_EPS = 0.02  # a top-p/top-k cut this close to a token's mass: that prompt leaves the exact fit
SETTINGS = (
    {"name": "T1", "temperature": 1.0, "top_p": 1.0, "top_k": -1},
    {"name": "T0.7-p0.9", "temperature": 0.7, "top_p": 0.9, "top_k": -1},
    {"name": "T1.3-k2", "temperature": 1.3, "top_p": 1.0, "top_k": 2},
)
DDTREES = ("ddtree", "ddtree-schedule")
LEAK_MARKERS = ("memory leak detected", "KV double free", "use-after-free")


# ---------------------------------------------------------------- statistics (plain Python: no scipy, no torch)


def _gammaincc(a, x):
    """The regularized upper incomplete gamma Q(a, x) (Numerical Recipes' series / continued fraction)."""
    if x <= 0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        for _i in range(10000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(log_front) * h


def chi2_sf(stat, dof):
    """P(chi-square with `dof` degrees of freedom >= stat)."""
    return _gammaincc(dof / 2.0, stat / 2.0)


def _result(stat, dof, **extra):
    p = chi2_sf(stat, dof)
    out = {"chi2": round(stat, 3), "dof": dof, "p_value": p, "rejected": p < ALPHA}
    out.update(extra)
    return out


def homogeneity(a_counts, b_counts, min_cell=10):
    """Chi-square test of homogeneity of two samples (dicts category -> count); categories with fewer than
    `min_cell` draws in both together are pooled into one cell (as analyze.homogeneity)."""
    rows, rare = [], [0, 0]
    for c in sorted(set(a_counts) | set(b_counts)):
        a, b = a_counts.get(c, 0), b_counts.get(c, 0)
        if a + b < min_cell:
            rare[0] += a
            rare[1] += b
        else:
            rows.append((a, b))
    if sum(rare):
        rows.append(tuple(rare))
    na, nb = sum(r[0] for r in rows), sum(r[1] for r in rows)
    stat = 0.0
    for a, b in rows:
        for obs, col in ((a, na), (b, nb)):
            exp = (a + b) * col / float(na + nb)
            if exp > 0:
                stat += (obs - exp) ** 2 / exp
    return _result(stat, max(1, len(rows) - 1), n_a=na, n_b=nb, cells=len(rows))


def goodness_of_fit(groups, min_expected=5.0):
    """Chi-square goodness of fit over independent groups (one a prompt), each (observed: category -> count,
    probs: category -> exact probability). Per group the categories expected >= min_expected keep their cell,
    the rest (and every category the exact distribution lacks) share one; statistics and dofs add up."""
    stat, dof, n_all = 0.0, 0, 0
    for observed, probs in groups:
        n = sum(observed.values())
        if not n:
            continue
        n_all += n
        kept = {c: p * n for c, p in probs.items() if p * n >= min_expected}
        cells = [(observed.get(c, 0), e) for c, e in kept.items()]
        other_e = n - sum(kept.values())
        if other_e > 1e-9:
            cells.append((n - sum(observed.get(c, 0) for c in kept), other_e))
        stat += sum((o - e) ** 2 / e for o, e in cells)
        dof += len(cells) - 1
    return _result(stat, max(1, dof), samples=n_all)


def sampling_distribution(logits, temperature, top_p=1.0, top_k=-1):
    """The distribution SGLang samples from (sampler.top_k_top_p_min_p_sampling_from_probs_torch): softmax of
    logits / T, sorted; ranks >= top_k dropped (top_k -1: none), then every token whose mass before it in
    the sorted order exceeds top_p; the rest renormalised. Returns {token: probability} of the kept tokens."""
    order, probs = _sorted_probs(logits, temperature)
    keep, before = {}, 0.0
    for rank, (tok, p) in enumerate(zip(order, probs)):
        if (top_k > 0 and rank >= top_k) or before > top_p:
            break
        keep[tok] = p
        before += p
    total = sum(keep.values())
    return {t: p / total for t, p in keep.items()}


def filter_margin(logits, temperature, top_p=1.0, top_k=-1, min_mass=BOUNDARY_EPS):
    """How close the top-p / top-k cut comes to flipping a token of at least `min_mass` in or out (in
    probability; inf without a cut or with only lighter tokens near it). A fit against fp32 probabilities
    means little where bf16 may cut elsewhere; a token too light to matter may flip."""
    _order, probs = _sorted_probs(logits, temperature)
    margin, before = float("inf"), 0.0
    if 0 < top_k < len(probs) and probs[top_k - 1] >= min_mass:
        margin = probs[top_k - 1] - probs[top_k]
    if top_p < 1.0:
        for p in probs:
            if p >= min_mass:
                margin = min(margin, abs(before - top_p))
            before += p
    return margin


def _sorted_probs(logits, temperature):
    scaled = [v / temperature for v in logits]
    top = max(scaled)
    exps = [math.exp(v - top) for v in scaled]
    total = sum(exps)
    order = sorted(range(len(exps)), key=lambda i: -exps[i])
    return order, [exps[i] / total for i in order]


# ---------------------------------------------------------------- greedy comparisons


def first_divergence(a, b):
    """(position, a's token, b's token) where two id lists first differ (None past an end), or None."""
    a, b = a or [], b or []
    for j, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return j, x, y
    if len(a) != len(b):
        j = min(len(a), len(b))
        return j, a[j] if j < len(a) else None, b[j] if j < len(b) else None
    return None


def compare_outputs(labels, ref, other, what):
    """Every prompt whose output differs between two runs: [{what, prompt, position, tokens, prefix}] (prefix:
    the common ids before the difference, for the margin check). `ref`/`other`: lists of ids, None when a
    request failed (reported as a difference at position None)."""
    diffs = []
    for label, a, b in zip(labels, ref, other):
        if a is None or b is None:
            diffs.append(
                {"what": what, "prompt": label, "position": None, "tokens": [None, None], "error": "no output"}
            )
            continue
        d = first_divergence(a, b)
        if d is not None:
            pos, x, y = d
            diffs.append({"what": what, "prompt": label, "position": pos, "tokens": [x, y], "prefix": list(a[:pos])})
    return diffs


def near_tie(logprobs, a, b, nats=NEAR_TIE_NATS):
    """Whether tokens a and b are both within `nats` of the best log-probability (a list over the vocab)."""
    if a is None or b is None:
        return False
    best = max(logprobs)
    return best - min(logprobs[a], logprobs[b]) <= nats


def explain(diffs, target):
    """Marks each difference near_tie (True/False) with the target's top-2 there; `target` None (no model):
    every difference stays unexplained. Returns whether every difference is explained."""
    ok = True
    for d in diffs:
        if d.get("position") is None or target is None:
            d["near_tie"] = False
        else:
            lp = target.logprobs(d["prompt_ids"] + d["prefix"])
            top = sorted(range(len(lp)), key=lambda i: -lp[i])[:2]
            d["target_top2"] = [[t, round(math.exp(lp[t]), 4)] for t in top]
            d["gap_nats"] = round(max(lp) - min(lp[t] for t in d["tokens"]), 4) if None not in d["tokens"] else None
            d["near_tie"] = near_tie(lp, *d["tokens"])
        ok = ok and d["near_tie"]
    return ok


# ---------------------------------------------------------------- the workload


def build_workload(lang):
    """Every prompt of the run as token ids, from fixed seeds (the same here and on the device)."""
    rng = random.Random(23)
    prefix = lang.sample_ids(PREFIX_LEN, rng)
    suffixes = [lang.encode(p) for p in lang.greedy_prompts(n=48, seed=29)]
    branch = [lang.encode(p) for p in lang.branch_prompts()]
    short = [lang.encode(p) for p in lang.greedy_prompts()]
    crng = random.Random(31)
    return {
        "prefix": prefix,
        "radix_seq": [prefix + s for s in suffixes[:8]],
        "radix_conc": [prefix + s for s in suffixes[8:24]],
        "mixed_greedy": short[:8] + [prefix + s for s in suffixes[24:32]],
        "witness": [prefix + s for s in suffixes[32:40]],
        "victims": short[8:16],
        "chunked": [lang.sample_ids(n, crng) for n in CHUNK_LENGTHS],
        "sampled": dict(
            [("S%d" % i, b) for i, b in enumerate(branch)] + [("L%d" % i, prefix + b) for i, b in enumerate(branch[:4])]
        ),
    }


def sampled_jobs(workload):
    """The mixed batch: (kind, key, setting name or None, ids, params), greedy ones spread through it."""
    jobs = []
    for key, ids in workload["sampled"].items():
        n = SHORT_SAMPLES if key.startswith("S") else LONG_SAMPLES
        for s in SETTINGS:
            params = {k: s[k] for k in ("temperature", "top_p", "top_k")}
            params.update(max_new_tokens=SAMPLED_NEW, ignore_eos=True)
            jobs += [("sampled", key, s["name"], ids, params)] * n
    random.Random(5).shuffle(jobs)
    greedy = {"temperature": 0, "max_new_tokens": GREEDY_NEW, "ignore_eos": True}
    for i, ids in enumerate(workload["mixed_greedy"]):
        jobs.insert((i + 1) * len(jobs) // (len(workload["mixed_greedy"]) + 1), ("greedy", i, None, ids, greedy))
    return jobs


def sample_counts(samples):
    """{setting: {"prompt|t1|t2": count}} from [[key, setting, ids], ...] (ids None: a failed request)."""
    out = {}
    for key, setting, ids in samples:
        if ids and len(ids) >= 2:
            cat = "%s|%d|%d" % (key, ids[0], ids[1])
            counts = out.setdefault(setting, {})
            counts[cat] = counts.get(cat, 0) + 1
    return out


def cache_misses(outputs, prefix_len, slack=RADIX_SLACK, skip_first=True):
    """Indices of the requests whose cached_tokens fell short of the shared prefix (the first one of a
    sequential run is expected to miss)."""
    return [
        i
        for i, o in enumerate(outputs)
        if not (skip_first and i == 0) and (o is None or (o.get("cached_tokens") or 0) < prefix_len - slack)
    ]


def stream_is_cumulative(chunks):
    """Whether each streamed chunk's ids extend the previous chunk's (SGLang's default, non-incremental)."""
    return all(chunks[i][: len(chunks[i - 1])] == chunks[i - 1] for i in range(1, len(chunks)))


def max_prefill_tokens(log):
    """The most new tokens of any `Prefill batch` line of a server log (0: none logged)."""
    most = 0
    for line in log.splitlines():
        if "Prefill batch" in line and "#new-token:" in line:
            try:
                most = max(most, int(line.split("#new-token:")[1].split(",")[0]))
            except ValueError:
                pass
    return most


# ---------------------------------------------------------------- HTTP


def generate(server, ids, params, stream=False, rid=None, cut_after=None, cut="close", timeout=300):
    """One /generate request with input_ids -> {ids, cached_tokens, prompt_tokens, completion_tokens, finish,
    accept}; streamed: also `chunks` (each chunk's ids) and `cumulative`. `cut_after` N: after N chunks close
    the connection (`cut` "close") or POST /abort_request with `rid` and read on to the end ("abort")."""
    body = {"input_ids": ids, "sampling_params": params}
    if stream:
        body["stream"] = True
    if rid:
        body["rid"] = rid
    req = server.request("/generate", body)
    chunks, last, abort_status = [], {}, None
    with urllib.request.urlopen(req, timeout=timeout) as r:
        if not stream:
            last = json.loads(r.read())
        else:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                payload = line[len("data:") :].strip()
                if payload == "[DONE]":
                    break
                last = json.loads(payload)
                chunks.append(list(last.get("output_ids") or []))
                if cut_after is not None and len(chunks) == cut_after:
                    if cut == "close":
                        break
                    abort_status = post_status(server, "/abort_request", {"rid": rid})
                    cut_after = None
    m = last.get("meta_info", {})
    out = {
        "ids": last.get("output_ids"),
        "cached_tokens": m.get("cached_tokens"),
        "prompt_tokens": m.get("prompt_tokens"),
        "completion_tokens": m.get("completion_tokens"),
        "finish": (m.get("finish_reason") or {}).get("type") if isinstance(m.get("finish_reason"), dict) else None,
        "accept": m.get("spec_accept_length"),
    }
    if stream:
        out["chunks"] = len(chunks)
        out["cumulative"] = stream_is_cumulative(chunks)
    if cut == "abort" and cut_after is None:
        out["abort_status"] = abort_status
    return out


def post_status(server, path, body):
    """POST a JSON body; the HTTP status (SGLang's /abort_request answers 200 with an empty body)."""
    try:
        with urllib.request.urlopen(server.request(path, body), timeout=30) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def safe(fn, tries=3):
    """fn() or {"error": ...}: one failed request is evidence, not the end of the phase. A connection refused
    or reset before any answer is tried again (as scenario.Server.generate does): a streamed request that was
    answered is not (its chunks were read), since it ends in an HTTP error or its own result."""
    for attempt in range(tries):
        try:
            return fn()
        except ConnectionError as e:
            if attempt == tries - 1:
                return {"error": repr(e), "ids": None}
            time.sleep(0.5)
        except Exception as e:  # noqa: BLE001
            return {"error": repr(e), "ids": None}


def many(server, ids_list, params, conc, **kw):
    with cf.ThreadPoolExecutor(conc) as ex:
        return list(ex.map(lambda ids: safe(lambda: generate(server, ids, params, **kw)), ids_list))


def http_status(server, path, method="GET"):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (server.port, path), method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:  # noqa: BLE001
        return repr(e)


def load_core(server):
    try:
        return (server.get("/v1/loads?include=core").get("loads") or [{}])[0]
    except Exception as e:  # noqa: BLE001
        return {"error": repr(e)}


# ---------------------------------------------------------------- the phases (each server runs them in order)

GREEDY = {"temperature": 0, "max_new_tokens": GREEDY_NEW, "ignore_eos": True}


def phase_radix(server, w):
    seq = [safe(lambda ids=ids: generate(server, ids, GREEDY)) for ids in w["radix_seq"]]
    conc = many(server, w["radix_conc"], GREEDY, 16)
    return {"seq": seq, "conc": conc}


def phase_chunked(server, w):
    seq = [safe(lambda ids=ids: generate(server, ids, GREEDY)) for ids in w["chunked"]]
    conc = many(server, w["chunked"], GREEDY, len(w["chunked"]))
    return {"seq": seq, "conc": conc}


def phase_mixed(server, w):
    jobs = sampled_jobs(w)
    t = time.time()
    with cf.ThreadPoolExecutor(48) as ex:
        outs = list(ex.map(lambda j: safe(lambda: generate(server, j[3], j[4])), jobs))
    greedy = [None] * len(w["mixed_greedy"])
    samples = []
    for (kind, key, setting, _ids, _p), o in zip(jobs, outs):
        if kind == "greedy":
            greedy[key] = o
        else:
            samples.append([key, setting, o.get("ids")])
    errors = sum(1 for o in outs if "error" in o)
    return {"greedy": greedy, "samples": samples, "errors": errors, "seconds": round(time.time() - t, 1)}


def phase_stream(server, w):
    prompts = w["radix_seq"] + w["chunked"][:2]
    return {"outputs": [safe(lambda ids=ids: generate(server, ids, GREEDY, stream=True)) for ids in prompts]}


def wait_idle(server, limit=30):
    t = time.time()
    core = {}
    while time.time() - t < limit:
        core = load_core(server)
        if not core.get("num_running_reqs") and not core.get("num_waiting_reqs") and "error" not in core:
            return round(time.time() - t, 1), core
        time.sleep(0.5)
    return None, core


def phase_abort(server, w):
    witness = {"temperature": 0, "max_new_tokens": WITNESS_NEW, "ignore_eos": True}
    res = {"base": many(server, w["witness"], witness, 8)}
    victims = []
    for i, ids in enumerate(w["victims"]):
        # closed: sampled (fewer tokens a step, so one left running shows); by rid: greedy and sampled
        cut = "close" if i < 4 else "abort"
        greedy = cut == "abort" and i % 2 == 0
        params = {"temperature": 0 if greedy else 1.0, "max_new_tokens": VICTIM_NEW, "ignore_eos": True}
        victims.append((ids, params, cut, "traffic-%s-victim-%d" % (server.name, i)))
    with cf.ThreadPoolExecutor(16) as ex:
        vf = [
            ex.submit(
                safe,
                lambda v=v: generate(server, v[0], v[1], stream=True, rid=v[3], cut_after=VICTIM_CHUNKS, cut=v[2]),
                1,  # a victim is never sent twice
            )
            for v in victims
        ]
        time.sleep(0.5)  # the victims are decoding when the witnesses come
        wf = [ex.submit(safe, lambda ids=ids: generate(server, ids, witness)) for ids in w["witness"]]
        res["during"] = [f.result() for f in wf]
        res["victims"] = [dict(f.result(), cut=v[2]) for f, v in zip(vf, victims)]
    res["idle_after_s"], res["load_idle"] = wait_idle(server)
    res["health"] = http_status(server, "/health")
    res["after"] = many(server, w["witness"], witness, 8)
    res["load_after"] = wait_idle(server)[1]
    res["flush_cache"] = http_status(server, "/flush_cache", "POST")
    res["load_flushed"] = load_core(server)
    res["health_end"] = http_status(server, "/health")
    if res["idle_after_s"] is None:  # a victim still runs: stop it so the server ends clean
        res["abort_all"] = post_status(server, "/abort_request", {"abort_all": True})
    return res


PHASES = (("radix", phase_radix), ("chunked", phase_chunked), ("mixed", phase_mixed), ("stream", phase_stream))
PHASES += (("abort", phase_abort),)
PHASE_NEED_S = {"radix": 40, "chunked": 60, "mixed": 90, "stream": 40, "abort": 60}


def run_server(server, name, w, phases, deadline, results):
    """`server`'s phases in order (its results under `name`), each skipped when it would pass `deadline`."""
    res = results[name]
    for phase, fn in phases:
        if time.time() + PHASE_NEED_S[phase] > deadline:
            res[phase] = {"skipped": "%.0f s left, the phase needs ~%d" % (deadline - time.time(), PHASE_NEED_S[phase])}
            continue
        t = time.time()
        try:
            res[phase] = fn(server, w)
        except Exception as e:  # noqa: BLE001
            res[phase] = {"error": repr(e)}
        res[phase]["seconds"] = round(time.time() - t, 1)
        print("[traffic] %s %s done in %.0f s" % (server.name, phase, time.time() - t), flush=True)
    try:
        res["server_info"] = {
            k: server.get("/server_info").get(k) for k in ("version", "speculative_algorithm", "disable_radix_cache")
        }
    except Exception as e:  # noqa: BLE001
        res["server_info"] = {"error": repr(e)}


# ---------------------------------------------------------------- the checks


class ExactTarget(object):
    """The target in fp32 (Hugging Face, same weights): log-probabilities of the next token after some ids."""

    def __init__(self, models):
        import torch
        from transformers import Qwen3ForCausalLM

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        path = os.path.join(models, "tiny-qwen3")
        self.model = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32).to(self.device).eval()
        self.cache = {}

    def logits(self, ids):
        key = tuple(ids)
        if key not in self.cache:
            with self.torch.no_grad():
                x = self.torch.tensor([ids], device=self.device)
                self.cache[key] = self.model(input_ids=x).logits[0, -1].float().cpu().tolist()
        return self.cache[key]

    def logprobs(self, ids):
        lg = self.logits(ids)
        top = max(lg)
        log_total = top + math.log(sum(math.exp(v - top) for v in lg))
        return [v - log_total for v in lg]


def exact_joint(target, ids, setting, min_p1=1e-4):
    """P(t1, t2) under a setting, as {"t1|t2": p}, and the smallest filter margin met (None: no model)."""
    args = (setting["temperature"], setting["top_p"], setting["top_k"])
    lg1 = target.logits(ids)
    p1 = sampling_distribution(lg1, *args)
    margin = filter_margin(lg1, *args)
    joint = {}
    for t1, pa in p1.items():
        if pa < min_p1:
            continue
        lg2 = target.logits(list(ids) + [t1])
        margin = min(margin, filter_margin(lg2, *args))
        for t2, pb in sampling_distribution(lg2, *args).items():
            joint["%d|%d" % (t1, t2)] = pa * pb
    return joint, margin


def fit_server(samples, workload, target, setting):
    """Goodness of fit of one server's (t1, t2) per prompt against the exact distribution under `setting`;
    prompts whose top-p/top-k cut lies within BOUNDARY_EPS of a token are left out (and counted)."""
    counts = sample_counts(samples).get(setting["name"], {})
    groups, left_out = [], []
    for key, ids in workload["sampled"].items():
        joint, margin = exact_joint(target, ids, setting)
        if margin < BOUNDARY_EPS:
            left_out.append(key)
            continue
        observed = {c.split("|", 1)[1]: n for c, n in counts.items() if c.split("|", 1)[0] == key}
        groups.append((observed, joint))
    out = goodness_of_fit(groups)
    out["prompts_left_out"] = left_out
    return out


def sampled_verdict(tests):
    """tests: {setting: {server: {"vs_none": result, "exact": result}}} (NONE: "exact" only). DDTREE servers
    must pass every test, the control must be rejected by every test, NONE must pass its exact fit."""
    problems = []
    for setting, by_server in tests.items():
        for name, t in by_server.items():
            for kind, r in t.items():
                if r is None or "p_value" not in r:
                    problems.append("%s %s %s: no test" % (setting, name, kind))
                elif name == "ddtree-control" and not r["rejected"]:
                    problems.append("%s control not rejected by %s (p=%.3g)" % (setting, kind, r["p_value"]))
                elif name != "ddtree-control" and r["rejected"]:
                    problems.append("%s %s rejected by %s (p=%.3g)" % (setting, name, kind, r["p_value"]))
    return problems


def ok_outputs(outs):
    return [o.get("ids") if isinstance(o, dict) else None for o in outs or []]


def check(problems, **evidence):
    return dict({"pass": not problems, "problems": problems}, **evidence)


def greedy_pairs(servers, phase, key, labels):
    """DDTREE servers vs NONE on one phase's outputs -> diffs."""
    diffs = []
    none = servers.get("none", {}).get(phase, {})
    for name in DDTREES:
        other = servers.get(name, {}).get(phase, {})
        if key not in none or key not in other:
            diffs.append(
                {"what": "%s %s.%s" % (name, phase, key), "prompt": None, "position": None, "error": "missing"}
            )
            continue
        diffs += compare_outputs(
            labels, ok_outputs(none[key]), ok_outputs(other[key]), "%s vs none %s.%s" % (name, phase, key)
        )
    return diffs


def attach_prompts(diffs, prompts_by_label):
    for d in diffs:
        if d.get("position") is not None:
            d["prompt_ids"] = prompts_by_label[d["prompt"]]
    return diffs


def evaluate(doc, workload, target, logs=None):
    """Each check's verdict and evidence from the raw outputs of doc["servers"]."""
    s = doc["servers"]
    names = [n for n in ("none",) + DDTREES if n in s]
    checks = {}
    labels = {}
    for kind in ("radix_seq", "radix_conc", "chunked", "witness", "mixed_greedy"):
        labels[kind] = ["%s[%d]" % (kind, i) for i in range(len(workload[kind]))]
    by_label = {lab: ids for kind, labs in labels.items() for lab, ids in zip(labs, workload[kind])}

    def finish(name, diffs, problems, **evidence):
        attach_prompts(diffs, by_label)
        explained = explain(diffs, target)
        for d in diffs:
            d.pop("prompt_ids", None)
            d.pop("prefix", None)
        if not explained:
            problems = problems + [
                "%d greedy difference(s) not explained by a near-tie" % sum(not d["near_tie"] for d in diffs)
            ]
        checks[name] = check(problems, differences=diffs, **evidence)

    # 1. radix
    problems, hits = [], {}
    for n in names:
        r = s[n].get("radix", {})
        seq, conc = r.get("seq") or [], r.get("conc") or []
        hits[n] = {"seq": [o.get("cached_tokens") for o in seq], "conc": [o.get("cached_tokens") for o in conc]}
        if not seq or not conc:
            problems.append("%s: radix phase %s" % (n, r.get("skipped") or r.get("error") or "empty"))
            continue
        miss = cache_misses(seq, PREFIX_LEN) + [len(seq) + i for i in cache_misses(conc, PREFIX_LEN, skip_first=False)]
        if miss:
            problems.append("%s: %d request(s) missed the cached prefix: %s" % (n, len(miss), miss[:8]))
        if (s[n].get("server_info") or {}).get("disable_radix_cache"):
            problems.append("%s: the server says its radix cache is off" % n)
    diffs = greedy_pairs(s, "radix", "seq", labels["radix_seq"]) + greedy_pairs(
        s, "radix", "conc", labels["radix_conc"]
    )
    finish("radix", diffs, problems, prefix_tokens=PREFIX_LEN, cached_tokens=hits)

    # 2. chunked prefill
    problems, most = [], {}
    for n in names:
        r = s[n].get("chunked", {})
        for part in ("seq", "conc"):
            got = [o.get("prompt_tokens") for o in r.get(part) or []]
            if got != list(CHUNK_LENGTHS):
                problems.append(
                    "%s %s: prompt_tokens %s, sent %s (%s)"
                    % (n, part, got, list(CHUNK_LENGTHS), r.get("error") or r.get("skipped"))
                )
        if logs is not None and n not in logs:
            problems.append("%s: no server log to read the prefill batches from" % n)
        elif logs is not None:
            most[n] = max_prefill_tokens(logs[n])
            if not 0 < most[n] <= CHUNK:
                problems.append("%s: a prefill batch of %d new tokens (chunk %d)" % (n, most[n], CHUNK))
    diffs = greedy_pairs(s, "chunked", "seq", labels["chunked"]) + greedy_pairs(s, "chunked", "conc", labels["chunked"])
    finish("chunked", diffs, problems, lengths=list(CHUNK_LENGTHS), max_prefill_new_tokens=most)

    # 3. mixed sampling in one batch
    problems, tests = [], {}
    none_samples = s.get("none", {}).get("mixed", {}).get("samples")
    for n in ("none",) + DDTREES + ("ddtree-control",):
        m = s.get(n, {}).get("mixed", {})
        if "samples" not in m:
            problems.append("%s: mixed phase %s" % (n, m.get("skipped") or m.get("error") or "missing"))
        elif m.get("errors"):
            problems.append("%s: %d request(s) of the mixed batch failed" % (n, m["errors"]))
    for setting in SETTINGS:
        per = tests[setting["name"]] = {}
        ref = sample_counts(none_samples or []).get(setting["name"], {})
        for n in ("none",) + DDTREES + ("ddtree-control",):
            samples = s.get(n, {}).get("mixed", {}).get("samples")
            if samples is None:
                continue
            t = per[n] = {}
            if n != "none":
                t["vs_none"] = homogeneity(ref, sample_counts(samples).get(setting["name"], {}))
            t["exact"] = fit_server(samples, workload, target, setting) if target is not None else None
    problems += sampled_verdict(tests)
    diffs = greedy_pairs(s, "mixed", "greedy", labels["mixed_greedy"])
    control = s.get("ddtree-control", {}).get("mixed", {}).get("greedy")
    control_greedy = None
    if control and none_samples is not None:
        control_greedy = compare_outputs(
            labels["mixed_greedy"], ok_outputs(s["none"]["mixed"]["greedy"]), ok_outputs(control), "control vs none"
        )
        for d in control_greedy:
            d.pop("prefix", None)
    finish("mixed", diffs, problems, settings=list(SETTINGS), tests=tests, control_greedy_differences=control_greedy)

    # 4. streaming
    problems, diffs = [], []
    stream_labels = labels["radix_seq"] + labels["chunked"][:2]
    for n in names:
        st = s[n].get("stream", {}).get("outputs")
        if not st:
            problems.append("%s: stream phase %s" % (n, s[n].get("stream", {}).get("skipped") or "missing"))
            continue
        bad = [stream_labels[i] for i, o in enumerate(st) if not o.get("cumulative") or (o.get("chunks") or 0) < 2]
        if bad:
            problems.append("%s: streamed chunks not cumulative or not streamed: %s" % (n, bad))
        plain = ok_outputs(s[n].get("radix", {}).get("seq")) + ok_outputs(s[n].get("chunked", {}).get("seq"))[:2]
        diffs += compare_outputs(stream_labels, plain, ok_outputs(st), "%s stream vs not" % n)
    none_st = ok_outputs(s.get("none", {}).get("stream", {}).get("outputs"))
    for n in DDTREES:
        if n in s:
            diffs += compare_outputs(
                stream_labels, none_st, ok_outputs(s[n].get("stream", {}).get("outputs")), "%s vs none stream" % n
            )
    finish("stream", diffs, problems)

    # 5. abort
    problems, diffs, evidence = [], [], {}
    for n in names:
        a = s[n].get("abort", {})
        if "base" not in a:
            problems.append("%s: abort phase %s" % (n, a.get("skipped") or a.get("error") or "missing"))
            continue
        victims = a.get("victims") or []
        aborted = [v.get("finish") for v in victims if v.get("cut") == "abort"]
        evidence[n] = {
            k: a.get(k) for k in ("idle_after_s", "load_idle", "health", "flush_cache", "load_flushed", "health_end")
        }
        evidence[n]["victims"] = [
            {k: v.get(k) for k in ("cut", "finish", "completion_tokens", "chunks", "error")} for v in victims
        ]
        if any(f != "abort" for f in aborted):
            problems.append("%s: /abort_request victims finished with %s" % (n, aborted))
        if a.get("idle_after_s") is None or a["idle_after_s"] > ABORT_IDLE_S:
            problems.append(
                "%s: busy %s s after the witnesses (a victim was not aborted): %s"
                % (n, a.get("idle_after_s"), a.get("load_idle"))
            )
        for k in ("load_idle", "load_after", "load_flushed"):
            if (a.get(k) or {}).get("num_used_tokens") != 0:
                problems.append("%s: %s num_used_tokens %s" % (n, k, (a.get(k) or {}).get("num_used_tokens")))
        for k in ("health", "flush_cache", "health_end"):
            if a.get(k) != 200:
                problems.append("%s: %s answered %s" % (n, k, a.get(k)))
        if logs is not None:
            leaks = [m for m in LEAK_MARKERS if m in logs.get(n, "")]
            if leaks:
                problems.append("%s: server log says %s" % (n, leaks))
        base = ok_outputs(a["base"])
        for k in ("during", "after"):
            diffs += compare_outputs(labels["witness"], base, ok_outputs(a.get(k)), "%s witness %s vs alone" % (n, k))
    for k in ("base", "during", "after"):
        diffs += greedy_pairs(s, "abort", k, labels["witness"])
    finish("abort", diffs, problems, servers=evidence)
    return checks


def acceptance(servers):
    """Each server's mean spec_accept_length per phase (1.0 everywhere would mean the drafter never helped)."""
    out = {}
    for n, r in servers.items():
        for phase, v in r.items():
            if not isinstance(v, dict):
                continue
            outs = [
                o for key in ("seq", "conc", "greedy", "outputs", "base", "during", "after") for o in v.get(key) or []
            ]
            acc = [o.get("accept") for o in outs if isinstance(o, dict) and o.get("accept") is not None]
            if acc:
                out.setdefault(n, {})[phase] = round(sum(acc) / len(acc), 3)
    return out


def summary_lines(checks):
    lines = []
    for name, c in checks.items():
        lines.append("traffic %-8s %s %s" % (name, "PASS" if c["pass"] else "FAIL", "; ".join(c["problems"])[:600]))
        for d in c.get("differences", [])[:6]:
            lines.append(
                "  diff %s %s pos %s tokens %s near_tie %s top2 %s"
                % (d["what"], d["prompt"], d.get("position"), d.get("tokens"), d.get("near_tie"), d.get("target_top2"))
            )
    for setting, by_server in checks.get("mixed", {}).get("tests", {}).items():
        for n, t in by_server.items():
            lines.append(
                "  chi2 %s %-16s %s"
                % (setting, n, " ".join("%s p=%.3g" % (k, r["p_value"]) for k, r in t.items() if r and "p_value" in r))
            )
    return lines


def read_logs(out, names):
    logs = {}
    for n in names:
        path = os.path.join(out, "server-traffic-%s.log" % n)
        if os.path.exists(path):
            with open(path, errors="replace") as fh:
                logs[n] = fh.read()
    return logs


def analyze(doc, models, out=None):
    lang = sl.Language(kind=doc.get("language"))
    workload = build_workload(lang)
    try:
        target = ExactTarget(models)
    except Exception as e:  # noqa: BLE001 (no torch/transformers: the checks that need the model fail)
        doc["target_error"] = repr(e)
        target = None
    logs = read_logs(out, doc["servers"]) if out else None
    checks = evaluate(doc, workload, target, logs)
    doc["checks"] = checks
    doc["acceptance"] = acceptance(doc["servers"])
    doc["pass"] = all(c["pass"] for c in checks.values())
    return doc


def make_servers(out, models):
    extra = ["--chunked-prefill-size", str(CHUNK), "--context-length", str(CONTEXT)]
    common = {"radix": True, "extra_flags": extra}
    release, control = scenario.RELEASE, scenario.CONTROL
    servers = [
        scenario.Server("traffic-none", "NONE", release, 30040, out, models, seed=41, **common),
        scenario.Server("traffic-ddtree", "DDTREE", release, 30041, out, models, seed=42, budget=15, top_k=8, **common),
        scenario.Server(
            "traffic-ddtree-schedule",
            "DDTREE",
            release,
            30042,
            out,
            models,
            seed=43,
            budget="1:31,16:15",
            top_k=8,
            **common,
        ),
        scenario.Server(
            "traffic-ddtree-control", "DDTREE", control, 30043, out, models, seed=44, budget=15, top_k=8, **common
        ),
    ]
    for s in servers:
        s.set_env("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")
    return servers


def main(argv):
    if argv[1] == "--analyze":
        with open(argv[2]) as fh:
            doc = json.load(fh)
        analyze(doc, argv[3], os.path.dirname(os.path.abspath(argv[2])))
        with open(argv[2], "w") as fh:
            json.dump(doc, fh)
        print("\n".join(summary_lines(doc["checks"])))
        return 0 if doc["pass"] else 1
    scenario.exit_on_sigterm()
    out, models = argv[1], argv[2]
    t0 = time.time()
    limit = float(os.environ.get("TRAFFIC_LIMIT_S", "420"))
    deadline = min(scenario.call_deadline() or t0 + limit, t0 + limit) - 45  # the analysis and the stops after
    lang = sl.Language()
    w = build_workload(lang)
    servers = make_servers(out, models)
    short = {s.name: s.name[len("traffic-") :] for s in servers}
    results = {short[s.name]: {} for s in servers}
    doc = {"plan": "traffic", "language": lang.kind, "servers": results}
    try:
        for s in servers:
            s.start()
        threads = []
        for s in servers:
            ready = s.wait_ready(limit=max(30, min(240, deadline - time.time())))
            results[short[s.name]].update(s.info)
            print(
                "[traffic] %s %s" % (s.name, "ready in %s s" % s.info.get("ready_s") if ready else s.info.get("error")),
                flush=True,
            )
            if not ready:
                continue
            name = short[s.name]
            phases = [p for p in PHASES if p[0] == "mixed"] if name == "ddtree-control" else PHASES
            th = threading.Thread(target=run_server, args=(s, name, w, phases, deadline, results))
            th.start()
            threads.append(th)
        for th in threads:
            th.join()
    finally:
        for s in servers:
            s.stop()
        doc["seconds_servers"] = round(time.time() - t0, 1)
        with open(os.path.join(out, "results-traffic.json"), "w") as fh:
            json.dump(doc, fh)
    try:
        analyze(doc, models, out)
    except Exception as e:  # noqa: BLE001 (the raw outputs are saved: --analyze redoes it)
        doc.update(analysis_error=repr(e), checks=doc.get("checks") or {}, **{"pass": False})
    doc["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(out, "results-traffic.json"), "w") as fh:
        json.dump(doc, fh)
    print("\n".join(summary_lines(doc["checks"])))
    print("[traffic] acceptance %s" % doc.get("acceptance"))
    print("[traffic] %s in %.0f s" % ("PASS" if doc["pass"] else "FAIL", time.time() - t0), flush=True)
    return 0 if doc["pass"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
