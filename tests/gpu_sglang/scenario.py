"""Start real SGLang 0.5.23 servers on the device and drive the lossless checks through HTTP.

Usage (on the device, after device-setup.sh): python scenario.py OUT MODELS PLAN
  PLAN tp1: NONE, DFLASH, DDTREE and the control release's DDTREE (planted lossy walk), all started with
            the same flags (only the algorithm and the release on PYTHONPATH differ); greedy (T = 0) on the
            64 held-out prompts at 1 and 16 concurrent requests; sampled (T = 1) on the branch prompts.
  PLAN tp2: DDTREE (then NONE) with --tp-size 2; greedy at 1 and 16 concurrent requests.
  PLAN sampled: NONE, then DDTREE, the control and DFLASH, each with its own --random-seed; T = 1 only.
SCENARIO_DRAFTER names the drafter directory under MODELS for every speculative server of tp1 and sampled
(default the shape's; e.g. train_models.py --dflash2's DFlash2 drafter).
Writes OUT/results-PLAN.json (raw outputs) and OUT/server-NAME.log; analyze.py turns them into summary.json.
NONE starts first (it compiles SGLang's JIT kernels into the shared cache), then DFLASH (its sampling
kernel), then the rest together: each later server finds the kernels compiled.
"""

import concurrent.futures as cf
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models_for_target  # noqa: E402
import synth_lang as sl  # noqa: E402

SITE = os.environ.get("SGLANG_SITE", "/tmp/site")
RELEASE = os.environ.get("OVERLAY_RELEASE", "/tmp/release/site")
CONTROL = os.environ.get("OVERLAY_CONTROL", "/tmp/release-control/site")
GREEDY_NEW = 64
SAMPLES_PER_PROMPT = 256
SAMPLED_NEW = 5
T0 = [time.time()]


# Target shapes (PERF_TARGET in perf.py): the target and drafter directories under MODELS, flags for every
# server, flags for a speculative one. "tiny": the trained tiny pair (train_models.py) or make_tiny's.
# "qwen3-8b", "qwen3-30b-a3b": make_shaped.py's configs, random weights (the target SGLang's dummy load format,
# the drafter make_shaped's seeded weights, read with --speculative-draft-load-format: equal acceptance), a smaller KV pool so that four 8B servers share
# one GPU of the device (each ~17 GB of weights; 32768 tokens of KV are 4.8 GB); the 30B-A3B's ~61 GB of
# weights leave room for one server at a time.
SHAPES = {
    "tiny": ("tiny-qwen3", "tiny-qwen3-dflash", ["--max-total-tokens", "131072"], []),
}
for _shape in models_for_target.RANDOM_SHAPES:
    SHAPES[_shape] = (
        "%s-shaped" % _shape,
        "%s-shaped-dflash" % _shape,
        ["--load-format", "dummy", "--max-total-tokens", "32768"],
        # The drafter's load format follows --load-format unless set: without this the seeded weights are
        # never read and the drafter is SGLang's dummy one.
        ["--speculative-draft-load-format", "safetensors"],
    )
# "embedded-qwen3-8b", "embedded-qwen3-30b-a3b": the trained tiny pair inside those shapes' weights
# (embed_models.py; MODELS is WORK/embedded-<shape>, PERF_DRAFTER picks a drafter level).
SHAPES.update(models_for_target.embedded_shapes())


def prefill_graph_flags():
    """SCENARIO_PREFILL_GRAPHS=0: every server of the call prefills eagerly. SGLang captures prefill CUDA graphs
    for 58 token counts at start-up, which on a 48-layer MoE target takes longer than a measurement (the first
    server of a call pays the kernels' compilation as well); the decode and verify graphs, the ones a decode
    step replays, stay on. Every algorithm then pays the same eager prefill, once a request."""
    value = os.environ.get("SCENARIO_PREFILL_GRAPHS", "1")
    if value not in ("0", "1"):
        raise ValueError("SCENARIO_PREFILL_GRAPHS is %r; it must be 1 (default: captured) or 0 (eager)" % value)
    return ["--disable-prefill-cuda-graph"] if value == "0" else []


# radix=True (traffic.py): the radix cache on, its pure-Python TreeCore chosen by this environment (the Rust one
# fails on the device's torch: "insert value must be an int64 tensor, got Float").
RADIX_ENV = {"SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python"}


def kv_pool_flags(extra, environ=None):
    """The shape's flags with SCENARIO_KV_TOKENS (when set) as --max-total-tokens: a smaller KV pool lets one more
    server of a shape share the GPU (three embedded 8B servers with 32768 tokens each do not fit an H100's 80 GB)."""
    tokens = (os.environ if environ is None else environ).get("SCENARIO_KV_TOKENS")
    if not tokens:
        return list(extra)
    if not tokens.isdigit() or int(tokens) < 1024:
        raise ValueError("SCENARIO_KV_TOKENS is %r; it must be a token count of at least 1024" % tokens)
    out = list(extra)
    if "--max-total-tokens" in out:
        out[out.index("--max-total-tokens") + 1] = tokens
        return out
    return out + ["--max-total-tokens", tokens]


def flags(models, port, tp=1, seed=1, shape="tiny", radix=False):
    """Every server's flags; `radix` leaves --disable-radix-cache out (the default keeps it)."""
    target, _draft, extra, _spec = SHAPES[shape]
    common = [
        "--model-path",
        os.path.join(models, target),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--attention-backend",
        "triton",
        "--sampling-backend",
        "pytorch",
        "--grammar-backend",
        "none",
        "--disable-radix-cache",
        "--mem-fraction-static",
        "0.85",
    ]
    if radix:
        common.remove("--disable-radix-cache")
    return (
        common
        + kv_pool_flags(extra)
        + prefill_graph_flags()
        + ["--max-running-requests", "48", "--random-seed", str(seed), "--tp-size", str(tp), "--log-level", "info"]
    )


def spec_flags(models, algo, shape="tiny", drafter=None, budget=15, top_k=8):
    """The speculative flags of a server: the shape's drafter unless `drafter` names another directory under
    MODELS; DDTREE's budget (an int or a schedule such as "1:63,16:15") and top-k (15 and 8 unless given;
    top_k None leaves the overlay's default for the budget)."""
    if algo == "NONE":
        return []
    _target, draft, _extra, spec = SHAPES[shape]
    out = [
        "--speculative-algorithm",
        algo,
        "--speculative-draft-model-path",
        os.path.join(models, drafter or draft),
    ] + spec
    if algo == "DDTREE":
        out += ["--speculative-ddtree-budget", str(budget)]
        if top_k is not None:
            out += ["--speculative-ddtree-top-k", str(top_k)]
    return out


class Server(object):
    def __init__(
        self, name, algo, release, port, out, models, tp=1, seed=1, shape="tiny", radix=False, extra_flags=(), **spec
    ):
        """`spec`: spec_flags' drafter, budget and top_k, for a server that differs from the defaults. `radix`:
        the radix cache on (flags' radix, RADIX_ENV in the environment); `extra_flags` go last."""
        self.name, self.algo, self.port, self.out = name, algo, port, out
        self.args = (
            [sys.executable, "-m", "sglang.launch_server"]
            + flags(models, port, tp, seed, shape, radix=radix)
            + spec_flags(models, algo, shape, **spec)
            + list(extra_flags)
        )
        self.env = dict(os.environ, PYTHONPATH=(release + ":" if release else "") + SITE)
        if radix:
            self.env.update(RADIX_ENV)
        self.proc = None
        self.info = {
            "name": name,
            "algorithm": algo,
            "release": release,
            "tp": tp,
            "seed": seed,
            "flags": self.args[3:],
        }
        if radix:
            self.info["radix_env"] = dict(RADIX_ENV)

    def set_env(self, spec):
        """Add NAME=VALUE[,NAME=VALUE...] to this server's environment (the switches a run compares)."""
        pairs = [item.split("=", 1) for item in spec.split(",") if item]
        self.env.update(pairs)
        self.info["env"] = ",".join("%s=%s" % (name, value) for name, value in pairs)

    def start(self):
        self.t0 = time.time()
        self.log = open(os.path.join(self.out, "server-%s.log" % self.name), "w")
        self.proc = subprocess.Popen(
            self.args, stdout=self.log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )

    def wait_ready(self, limit=300):
        while time.time() - self.t0 < limit:
            if self.proc.poll() is not None:
                self.info["error"] = "exited %s after %.0f s" % (self.proc.returncode, time.time() - self.t0)
                return False
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % self.port, timeout=3) as r:
                    if r.status == 200:
                        self.info["ready_s"] = round(time.time() - self.t0, 1)
                        return True
            except Exception:
                pass
            time.sleep(1)
        self.info["error"] = "no /health within %d s" % limit
        return False

    def request(self, path, body):
        """A JSON POST to this server."""
        return urllib.request.Request(
            "http://127.0.0.1:%d%s" % (self.port, path),
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )

    def post(self, path, body, timeout=180):
        with urllib.request.urlopen(self.request(path, body), timeout=timeout) as r:
            return json.loads(r.read())

    def get(self, path):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.port, path), timeout=30) as r:
            return json.loads(r.read())

    def generate(self, prompt, params, stream=False):
        """One /generate request. With ``stream`` the answer is read as SGLang streams it (one chunk a decode
        step), and the result also says when the first and the last chunk came (``stream_timing``)."""
        for attempt in range(3):
            try:
                if stream:
                    r, timing = self.post_stream(
                        "/generate", {"text": prompt, "sampling_params": params, "stream": True}
                    )
                else:
                    r, timing = self.post("/generate", {"text": prompt, "sampling_params": params}), None
                break
            except (ConnectionError, OSError):
                if attempt == 2:
                    raise
                time.sleep(0.5)
        m = r.get("meta_info", {})
        out = {
            "ids": r.get("output_ids"),
            "accept": m.get("spec_accept_length"),
            "verify_ct": m.get("spec_verify_ct"),
            "completion_tokens": m.get("completion_tokens"),
        }
        if timing is not None:
            out.update(timing)
        return out

    def post_stream(self, path, body, timeout=180):
        """POST a streaming request; the last chunk (it carries the whole meta_info) and ``stream_timing``."""
        t0 = time.perf_counter()
        arrivals, last = [], {}
        with urllib.request.urlopen(self.request(path, body), timeout=timeout) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                payload = line[len("data:") :].strip()
                if payload == "[DONE]":
                    break
                arrivals.append(time.perf_counter() - t0)
                last = json.loads(payload)
        return last, stream_timing(arrivals)

    def stop(self):
        """The server's whole process group (launcher, scheduler, detokenizer): a child left behind keeps the
        port and the GPU memory, and the next call's server on that port finds it taken."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                os.killpg(self.proc.pid, 0)  # the launcher is gone: is anything of its group left?
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                pass
        self.log.close()


def start_group(servers, **wait):
    """Start `servers` together, so that their start-ups (graph captures of a minute or more each) overlap,
    and wait for each (Server.wait_ready's `wait`) until it is ready or has failed (its info says which).
    Returns the ready ones."""
    for s in servers:
        s.start()
    return [s for s in servers if s.wait_ready(**wait)]


def call_deadline(environ=None):
    """When the device call ends (epoch seconds, CALL_DEADLINE exported by device-run.sh); 0 when unknown."""
    return float((os.environ if environ is None else environ).get("CALL_DEADLINE") or 0)


def server_fits(span, deadline, now):
    """Whether a server started `now` ends before the call's `deadline` (epoch seconds; 0: none known), if it
    takes `span` seconds as the server before it did (start, work, stop; 0: none yet). A server that cannot
    finish is not started: the device time its start would take buys no measurement."""
    return not deadline or not span or now + span < deadline


def in_groups(groups, work, deadline, label, clock=time.time, **wait):
    """Each group of servers started together (start_group, with its `wait`), its ready servers given to
    `work` as a list, and the whole group stopped before the next starts (servers that share the GPU's
    memory), unless the group would not end before `deadline` at the pace of the group before it: then none
    of it starts, and each server's info says why."""
    t0, span = clock(), 0.0
    unit = "server" if all(len(group) == 1 for group in groups) else "group"
    for group in groups:
        began = clock()
        if not server_fits(span, deadline, began):
            for s in group:
                s.info["skipped"] = "not started: %.0f s left in the call, the %s before took %.0f s" % (
                    deadline - began,
                    unit,
                    span,
                )
                print("[%s] %s %s" % (label, s.name, s.info["skipped"]), flush=True)
            continue
        try:
            ready = start_group(group, **wait)
            print(
                "[%s] after %.0f s: %s"
                % (
                    label,
                    clock() - t0,
                    ", ".join(
                        "%s %s" % (s.name, "ready" if s in ready else "failed: %s" % s.info.get("error")) for s in group
                    ),
                ),
                flush=True,
            )
            if ready:
                work(ready)
        finally:
            for s in group:
                s.stop()
        span = clock() - began


def one_at_a_time(servers, work, deadline, label, clock=time.time):
    """in_groups with a group per server (a shape whose weights leave room for one server): `work` gets
    each ready server."""
    in_groups([[s] for s in servers], lambda ready: work(ready[0]), deadline, label, clock)


def decode_graph_counts(log):
    """How many of a server log's decode batches replayed a CUDA graph and how many ran eagerly. SGLang logs
    ``cuda graph: True|False`` on its prefill lines too, and those run eagerly whenever the prefill graphs
    are off (SCENARIO_PREFILL_GRAPHS=0), so only the ``Decode batch`` lines count."""
    decode = [line for line in log.splitlines() if "Decode batch" in line]
    return {
        "graph_decode_batches": sum("cuda graph: True" in line for line in decode),
        "eager_decode_batches": sum("cuda graph: False" in line for line in decode),
    }


def stream_timing(arrivals):
    """Seconds from the request to each streamed chunk -> the first chunk's latency (prefill and queueing:
    costs every algorithm pays once a request) and the mean gap between later chunks (one decode step each,
    SGLang streaming every step's tokens), so servers' decode steps compare without those fixed costs."""
    if not arrivals:
        return {"chunks": 0}
    gaps = len(arrivals) - 1
    return {
        "chunks": len(arrivals),
        "first_chunk_s": round(arrivals[0], 4),
        "last_chunk_s": round(arrivals[-1], 4),
        "step_ms": round(1000 * (arrivals[-1] - arrivals[0]) / gaps, 3) if gaps else None,
    }


def exit_on_sigterm():
    """Turn SIGTERM (device-run.sh's `timeout`) into SystemExit, so that `finally` stops the servers."""
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))


def run_many(server, prompts, params, conc):
    t = time.time()
    with cf.ThreadPoolExecutor(conc) as ex:
        outs = list(ex.map(lambda p: server.generate(p, params), prompts))
    return outs, round(time.time() - t, 2)


def greedy(server, prompts):
    params = {"temperature": 0, "max_new_tokens": GREEDY_NEW, "ignore_eos": True}
    res = {}
    for conc in (1, 16):
        outs, secs = run_many(server, prompts, params, conc)
        res["c%d" % conc] = {"outputs": outs, "seconds": secs}
    return res


def sampled(server, prompts):
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": SAMPLED_NEW, "ignore_eos": True}
    jobs = [p for p in prompts for _i in range(SAMPLES_PER_PROMPT)]
    outs, secs = run_many(server, jobs, params, 64)
    by_prompt = {}
    for p, o in zip(jobs, outs):
        by_prompt.setdefault(str(prompts.index(p)), []).append(o["ids"])
    acc = [o["accept"] for o in outs if o["accept"] is not None]
    return {"samples": by_prompt, "seconds": secs, "mean_accept": (sum(acc) / len(acc)) if acc else None}


def dump(out, plan, lang, results, t0):
    doc = {
        "plan": plan,
        "seconds": round(time.time() - t0, 1),
        "servers": results,
        "language": lang.kind,
        "greedy_prompts": lang.greedy_prompts(),
        "branch_prompts": lang.branch_prompts(),
    }
    with open(os.path.join(out, "results-%s.json" % plan), "w") as fh:
        json.dump(doc, fh)


def scenario(server, plan, lang, results, lock):
    res = dict(server.info)
    try:
        if not server.wait_ready():
            return
        res.update(server.info)
        try:
            if plan != "sampled":
                res["greedy"] = greedy(server, lang.greedy_prompts())
        except Exception as e:  # noqa: BLE001 (recorded as evidence; the next phase still runs)
            res["greedy_error"] = repr(e)
        if plan in ("tp1", "sampled"):
            try:
                res["sampled"] = sampled(server, lang.branch_prompts())
            except Exception as e:  # noqa: BLE001
                res["sampled_error"] = repr(e)
        try:
            info = server.get("/server_info")
            st = (info.get("internal_states") or [{}])[0]
            res["server_info"] = {
                "avg_spec_accept_length": st.get("avg_spec_accept_length"),
                "speculative_algorithm": info.get("speculative_algorithm"),
                "version": info.get("version"),
            }
        except Exception as e:  # noqa: BLE001 (evidence, not control flow)
            res["server_info_error"] = repr(e)
    except Exception as e:  # noqa: BLE001
        res["error"] = repr(e)
    finally:
        server.stop()
        with lock:
            results[server.name] = res
            dump(server.out, plan, lang, results, T0[0])
        print("[scenario] %s done: %s" % (server.name, {k: res.get(k) for k in ("ready_s", "error")}), flush=True)


def main():
    exit_on_sigterm()
    out, models, plan = sys.argv[1], sys.argv[2], sys.argv[3]
    lang = sl.Language()
    results, lock, threads = {}, threading.Lock(), []
    drafter = {"drafter": os.environ.get("SCENARIO_DRAFTER") or None}
    if plan == "tp1":
        waves = [
            [Server("none", "NONE", RELEASE, 30000, out, models)],
            [Server("dflash", "DFLASH", RELEASE, 30001, out, models, **drafter)],
            [
                Server("ddtree", "DDTREE", RELEASE, 30002, out, models, **drafter),
                Server("ddtree-control", "DDTREE", CONTROL, 30003, out, models, **drafter),
            ],
        ]
    elif plan == "sampled":
        # SCENARIO_DDTREE_BUDGET: the DDTREE and control servers' budget (default 15, top-k 8; another
        # budget takes the overlay's top-k for it), e.g. the widest tree a change allows.
        budget = os.environ.get("SCENARIO_DDTREE_BUDGET")
        ddtree = dict(drafter, **({"budget": budget, "top_k": None} if budget else {}))
        # the T = 1 runs again, each server with its own --random-seed (in tp1 all had seed 1, so the
        # servers' sampling streams were not independent of each other)
        waves = [
            [Server("none", "NONE", RELEASE, 30020, out, models, seed=11)],
            [
                Server("ddtree", "DDTREE", RELEASE, 30021, out, models, seed=12, **ddtree),
                Server("ddtree-control", "DDTREE", CONTROL, 30022, out, models, seed=13, **ddtree),
                Server("dflash", "DFLASH", RELEASE, 30023, out, models, seed=14, **drafter),
            ],
        ]
    else:
        waves = [
            [Server("ddtree-tp2", "DDTREE", RELEASE, 30010, out, models, tp=2)],
            [Server("none-tp2", "NONE", RELEASE, 30011, out, models, tp=2)],
        ]
    t0 = T0[0] = time.time()
    for wave in waves:
        for s in wave:
            s.start()
            th = threading.Thread(target=scenario, args=(s, plan, lang, results, lock))
            th.start()
            threads.append(th)
        # the next wave starts once this one's servers are up (their JIT kernels are then in the cache)
        for s in wave:
            while (
                s.proc.poll() is None and "ready_s" not in s.info and "error" not in s.info and time.time() - s.t0 < 300
            ):
                time.sleep(1)
    for th in threads:
        th.join()
    dump(out, plan, lang, results, t0)
    print("[scenario] all done in %.0f s" % (time.time() - t0), flush=True)


if __name__ == "__main__":
    main()
