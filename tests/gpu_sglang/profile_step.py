"""Where a decode step's GPU time goes: DFLASH against DDTREE, from SGLang's own torch profiler.

Usage (on the device, after device-setup.sh): python profile_step.py OUT MODELS
PERF_TARGET picks the target and PERF_DRAFTER the drafter as in perf.py (target default qwen3-8b here). Starts a DFLASH and a DDTREE server
(scenario.py's flags, CUDA graphs on), and for 1 and 16 concurrent greedy requests: one warm-up wave,
then `/start_profile` with num_steps=PROFILE_STEPS (default 40, GPU activity: CUDA kernels and copies,
also those replayed from CUDA graphs) while a wave of requests runs. The traces stay on the device;
OUT/results-profile.json gets, per server and concurrency: the profiled span per step, GPU busy time per
step (kernels + copies, overlaps merged), idle time per step, and the kernels with the most time
(ms per step, launches per step), so two algorithms' steps compare kernel by kernel, and the CUDA
runtime calls that make the host wait (synchronizations, blocking copies) per step.
PROFILE_DDTREE_ENV=NAME=VALUE[,NAME=VALUE] sets variables on the DDTREE server only (e.g. DDTREE_SYNC_DEBUG=20:
its log then names the places in the tree step that synchronize).
PROFILE_CPU=1: host activity too (CPU ops and, with stacks, Python functions), and per step the host work
that ran while the GPU was idle ("host_during_gpu_idle": each event's own time inside the GPU's idle gaps,
children's time excluded), which says what keeps the GPU waiting at low concurrency. The Python profiler
slows the host, so spans and idle times of such a pass are not those of a plain one; PROFILE_CPU=both
profiles each server twice, GPU only and then with the host (keys NAME/cCONC and NAME/cCONC+cpu).
PROFILE_CONCS (default 1,16) picks the concurrencies.
PROFILE_DDTREE sets the DDTREE server's budget (an int or a schedule, e.g. 63 or "1:63,16:15"; default 15, top-k
8; another budget takes the overlay's top-k for it).
PROFILE_ONE_AT_A_TIME=1 starts, profiles and stops one server before the next (a shape whose weights leave
room for one server, e.g. qwen3-30b-a3b's 61 GB at random weights), and starts none that would not end before
CALL_DEADLINE at the pace of the one before it, as perf.py does.
The result lands in OUT/results-profile-TARGET.json, or results-profile-TARGET-TAG.json with PROFILE_TAG=TAG.
"""

import bisect
import concurrent.futures as cf
import glob
import gzip
import json
import os
import re
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenario as sc  # noqa: E402
import synth_lang as sl  # noqa: E402

STEPS = int(os.environ.get("PROFILE_STEPS", "40"))
# The profiled passes per server and concurrency: GPU activity only, host activity too, or one of each.
PASSES = {"1": ("cpu",), "both": ("gpu", "cpu")}.get(os.environ.get("PROFILE_CPU", ""), ("gpu",))
TOP = 40


def wave(server, prompts, conc):
    params = {"temperature": 0, "max_new_tokens": sc.GREEDY_NEW, "ignore_eos": True}
    with cf.ThreadPoolExecutor(conc) as ex:
        return list(ex.map(lambda p: server.generate(p, params), prompts[:conc]))


def start_profile(server, body):
    """POST /start_profile: SGLang answers with plain text, not JSON (Server.post parses JSON)."""
    with urllib.request.urlopen(server.request("/start_profile", body), timeout=60) as r:
        return r.read().decode(errors="replace")


def waves_until_trace(run_wave, pdir, limit_s):
    """Request waves (``run_wave()`` -> outputs) until the profiler has written its trace under ``pdir``, at most
    ``limit_s`` seconds: a drafter that accepts finishes a wave's requests in fewer steps than the profiler
    counts. Returns (every wave's outputs, the trace's path or None)."""
    outs, files, deadline = [], [], time.time() + limit_s
    while time.time() < deadline and not files:
        outs += run_wave()
        for _poll in range(4):
            time.sleep(1)
            files = glob.glob(os.path.join(pdir, "**", "*.trace.json.gz"), recursive=True)
            if files:
                break
    time.sleep(2)  # the exporter may still be writing
    return outs, (files[0] if files else None)


def busy_union(intervals):
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def idle_gaps(intervals, start, end, least=5.0):
    """The gaps (at least `least` us) between the merged busy intervals, within [start, end]."""
    gaps, last = [], start
    for s, e in sorted(intervals):
        if s - last >= least:
            gaps.append((last, s))
        last = max(last, e)
    if end - last >= least:
        gaps.append((last, end))
    return gaps


def overlap(gaps, starts, s, e):
    """Time of [s, e] inside the sorted, disjoint `gaps` (starts: their start times)."""
    total, index = 0.0, max(0, bisect.bisect_right(starts, s) - 1)
    while index < len(gaps) and gaps[index][0] < e:
        total += max(0.0, min(e, gaps[index][1]) - max(s, gaps[index][0]))
        index += 1
    return total


def host_during_idle(events, gaps, steps):
    """Per host event name: its own time (children excluded) inside the GPU's idle gaps, ms per step."""
    starts = [g[0] for g in gaps]
    host = [
        e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "python_function", "user_annotation")
    ]
    own = {}
    by_thread = {}
    for e in host:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)

    def close(frame):
        name = frame[0].get("name", "?")[:120]
        own[name] = own.get(name, 0.0) + frame[1] - frame[2]

    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # [event, its overlap, its children's overlap]
        for e in thread_events:
            while stack and stack[-1][0]["ts"] + stack[-1][0]["dur"] <= e["ts"]:
                close(stack.pop())
            frame = [e, overlap(gaps, starts, e["ts"], e["ts"] + e["dur"]), 0.0]
            if stack:
                stack[-1][2] += frame[1]
            stack.append(frame)
        while stack:
            close(stack.pop())
    ms = 1000.0 * steps
    return [
        {"name": k, "ms_per_step": round(t / ms, 4)}
        for k, t in sorted(own.items(), key=lambda kv: -kv[1])[:TOP]
        if t > 0
    ]


def summarize(trace_path, steps, with_host=False):
    with gzip.open(trace_path, "rt") as fh:
        events = json.load(fh).get("traceEvents", [])
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:
        return {"error": "no GPU events in %s" % os.path.basename(trace_path)}
    start = min(e["ts"] for e in gpu)
    end = max(e["ts"] + e["dur"] for e in gpu)
    busy = busy_union([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    by_name = {}
    for e in gpu:
        name = e.get("name", "?")[:120]
        t, n = by_name.get(name, (0.0, 0))
        by_name[name] = (t + e["dur"], n + 1)
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:TOP]
    # Host waits: CUDA runtime calls that block the host until the GPU catches up.
    waits = {}
    for e in events:
        name = e.get("name", "")
        if (
            e.get("ph") == "X"
            and e.get("cat") in ("cuda_runtime", "cuda_driver")
            and ("Synchronize" in name or name in ("cudaMemcpy", "cuMemcpyDtoH_v2", "cudaMemcpyDtoH"))
        ):
            t, n = waits.get(name, (0.0, 0))
            waits[name] = (t + e["dur"], n + 1)
    ms = 1000.0 * steps
    extra = {}
    if with_host:
        gaps = idle_gaps([(e["ts"], e["ts"] + e["dur"]) for e in gpu], start, end)
        extra = {
            "idle_gaps_per_step": round(len(gaps) / steps, 1),
            "host_during_gpu_idle": host_during_idle(events, gaps, steps),
        }
    summary = {
        "steps": steps,
        "span_ms_per_step": round((end - start) / ms, 3),
        "busy_ms_per_step": round(busy / ms, 3),
        "idle_ms_per_step": round((end - start - busy) / ms, 3),
        "kernel_ms_per_step": round(sum(e["dur"] for e in gpu) / ms, 3),
        "launches_per_step": round(len(gpu) / steps, 1),
        "host_waits": {
            k: {"ms_per_step": round(t / ms, 3), "per_step": round(n / steps, 2)}
            for k, (t, n) in sorted(waits.items(), key=lambda kv: -kv[1][0])
        },
        "top": [{"name": k, "ms_per_step": round(t / ms, 4), "per_step": round(n / steps, 2)} for k, (t, n) in top],
    }
    return dict(extra, **summary)


def main():
    sc.exit_on_sigterm()
    out, models = sys.argv[1], sys.argv[2]
    shape = os.environ.get("PERF_TARGET", "qwen3-8b")
    lang = sl.Language()
    prompts = lang.greedy_prompts()
    prompts = (prompts * (64 // len(prompts) + 1))[:64]
    budget = os.environ.get("PROFILE_DDTREE")
    ddtree = {"budget": budget, "top_k": None} if budget else {}
    drafter = os.environ.get("PERF_DRAFTER") or None
    servers = [
        sc.Server("prof-dflash", "DFLASH", sc.RELEASE, 30111, out, models, shape=shape, drafter=drafter),
        sc.Server("prof-ddtree", "DDTREE", sc.RELEASE, 30112, out, models, shape=shape, drafter=drafter, **ddtree),
    ]
    if os.environ.get("PROFILE_DDTREE_ENV"):
        servers[1].set_env(os.environ["PROFILE_DDTREE_ENV"])
    one_at_a_time = os.environ.get("PROFILE_ONE_AT_A_TIME") == "1"
    tag = os.environ.get("PROFILE_TAG")
    doc = {"plan": "profile", "target": shape, "ddtree_setting": budget or "15", "steps": STEPS, "results": {}}
    doc["language"] = lang.kind
    t0 = time.time()

    def profile(s):
        for conc in [int(c) for c in os.environ.get("PROFILE_CONCS", "1,16").split(",")]:
            wave(s, prompts, conc)  # warm-up at this batch size
            for kind in PASSES:
                with_host = kind == "cpu"
                key = "%s/c%d%s" % (s.name, conc, "+cpu" if with_host and len(PASSES) > 1 else "")
                pdir = os.path.join(out, "prof", key.replace("/", "-"))
                os.makedirs(pdir, exist_ok=True)
                start_profile(
                    s,
                    {
                        "output_dir": pdir,
                        "num_steps": STEPS,
                        "activities": ["CPU", "GPU"] if with_host else ["GPU"],
                        "with_stack": with_host,
                        "profile_id": key.replace("/", "-"),
                    },
                )
                outs, trace = waves_until_trace(lambda c=conc: wave(s, prompts, c), pdir, 120)
                result = summarize(trace, STEPS, with_host) if trace else {"error": "no trace in %s" % pdir}
                result["mean_accept"] = sum(o["accept"] or 0 for o in outs) / len(outs)
                doc["results"][key] = result
                print("[profile] %s %s" % (key, {k: v for k, v in result.items() if k != "top"}), flush=True)

    try:
        if one_at_a_time:
            sc.one_at_a_time(servers, profile, sc.call_deadline(), "profile")
        else:
            ready = sc.start_group(servers)
            print("[profile] ready after %.0f s: %s" % (time.time() - t0, [s.name for s in ready]), flush=True)
            for s in ready:
                profile(s)
    finally:
        for s in servers:
            s.stop()
        doc["seconds"] = round(time.time() - t0, 1)
        for s in servers:
            try:
                log = open(os.path.join(out, "server-%s.log" % s.name)).read()
                s.info["sync_lines"] = re.findall(r"DDTREE host syncs[^\n]*", log)[-4:]
            except OSError:
                pass
        doc["servers"] = {s.name: s.info for s in servers}
        name = "results-profile-%s%s.json" % (shape, "-" + tag if tag else "")
        with open(os.path.join(out, name), "w") as fh:
            json.dump(doc, fh, indent=1)
    for key, r in doc["results"].items():
        print(
            "[profile] %s: span %s ms/step, busy %s, idle %s, %s launches/step, host waits %s"
            % (
                key,
                r.get("span_ms_per_step"),
                r.get("busy_ms_per_step"),
                r.get("idle_ms_per_step"),
                r.get("launches_per_step"),
                r.get("host_waits"),
            )
        )
        for k in (r.get("top") or [])[:20]:
            print("[profile]    %8.4f ms x%-6s %s" % (k["ms_per_step"], k["per_step"], k["name"][:90]))
        for k in (r.get("host_during_gpu_idle") or [])[:20]:
            print("[profile]    idle-host %8.4f ms %s" % (k["ms_per_step"], k["name"][:100]))


if __name__ == "__main__":
    main()
