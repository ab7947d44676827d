"""The health gate (the sglang_health module's own sequence) against real SGLang 0.5.23 servers on the device.

Usage (on the device, after device-setup.sh): python gate_real.py OUT MODELS
The device has no systemd, so the gate's view of the host is ProcessIO: the same ServiceIO (port, HTTP)
with the unit's state read from the server's process (what `systemctl show` would report for a unit
whose main process it is: running -> active/running; exited -> failed with Result=exit-code or signal)
and the journal read from the server's log file (what `journalctl -o cat` would print). Everything else
is plugins/module_utils/health_gate.HealthGate unchanged, with sglang_health's option defaults.

Scenarios (docs/health-gate.md, "Measured on real SGLang"):
  wave 1: NONE and DFLASH (release), each gated from its start with one shared baseline file, so each
          records the baseline of its decoding family; then the DFLASH server's scheduler is killed
          during a second gate run. A NONE server with the radix cache on (its Rust core fails on the
          device's kernel/torch pair) is gated from its start too: a real crash journal.
  wave 2: DDTREE (release): gated from its start against the same baseline file (DDTREE is in DFLASH's
          family, so DFLASH's baseline is its reference), conformance fixtures recorded, gated again
          (previous metrics). DDTREE with a planted lossy greedy walk (plant_greedy_lossy_walk.py):
          must fail at the baseline stage. DDTREE killed (SIGKILL) while starting: must fail at
          unit_watch with its cause.
  GATE_PLAN=killed (docs/evidence/gpu-sglang/gate-run3): three DDTREE servers started together, each gated
          from its start. One passes, then is gated again with a request timeout too short for any answer
          (a failed request on a healthy unit: it must stay at its stage). In the other two the launcher,
          or its scheduler, is SIGKILLed just before the gate's first baseline generation: each must fail
          at unit_watch with its cause (the gate reads the unit and journal again after the failed request).
  GATE_PLAN=fresh (docs/evidence/gpu-sglang/gate-run4): one DDTREE server gated from its start with
          min_accept_length 2.0 (its /server_info has no average yet: the gate reads the acceptance length
          from a /generate's meta_info), then gated again on the same server.
Writes OUT/gate-results.json (each run's passed, message and result), OUT/baseline.json, OUT/metrics.json,
OUT/conformance/*.json and the servers' logs (OUT/server-*.log).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import record_conformance  # noqa: E402
import scenario  # noqa: E402
import synth_lang as sl  # noqa: E402


def collection_path(tmp):
    """A directory holding ansible_collections/ddtree/sglang -> this checkout (as device_checks.py does)."""
    link = os.path.join(tmp, "ac", "ansible_collections", "ddtree", "sglang")
    if not os.path.exists(link):
        os.makedirs(os.path.dirname(link))
        os.symlink(REPO, link)
    return os.path.join(tmp, "ac")


sys.path.insert(0, collection_path("/tmp/gs-gate"))
from ansible_collections.ddtree.sglang.plugins.module_utils import health_gate  # noqa: E402
from ansible_collections.ddtree.sglang.plugins.modules.sglang_health import ARGUMENT_SPEC  # noqa: E402

LOCK = threading.Lock()
RESULTS = {}
T0 = time.time()


def log(text):
    print("[gate_real +%.0fs] %s" % (time.time() - T0, text), flush=True)


class ProcessIO(health_gate.ServiceIO):
    """ServiceIO for a server started as a plain process: unit state from the process, journal from its log."""

    def __init__(self, server, log_path):
        super().__init__(
            None,
            "systemctl",
            "journalctl",
            "sglang-%s.service" % server.name,
            "127.0.0.1",
            server.port,
            connect_timeout=1.0,
        )
        self.server = server
        self.log_path = log_path
        self.offset = 0
        self.partial = ""
        self.before_request = None  # a hook (method, path) -> None, for faults during a run
        self.gate = None  # the HealthGate using this IO (run_gate sets it), so a hook can read its stage

    def unit_properties(self):
        proc = self.server.proc
        started = "%d" % int(self.server.t0_monotonic * 1e6)
        rc = proc.poll()
        props = {
            "LoadState": "loaded",
            "NRestarts": "0",
            "ExecMainPID": str(proc.pid),
            "ActiveEnterTimestampMonotonic": started,
            "InactiveExitTimestamp": "n/a",
        }
        if rc is None:
            props.update(
                ActiveState="active",
                SubState="running",
                Result="success",
                MainPID=str(proc.pid),
                ExecMainCode="0",
                ExecMainStatus="0",
            )
        elif rc < 0:  # killed by a signal: CLD_KILLED, as systemd reports status=9/KILL
            props.update(
                ActiveState="failed",
                SubState="failed",
                Result="signal",
                MainPID="0",
                ExecMainCode="2",
                ExecMainStatus=str(-rc),
            )
        else:
            props.update(
                ActiveState="failed",
                SubState="failed",
                Result="exit-code" if rc else "success",
                MainPID="0",
                ExecMainCode="1",
                ExecMainStatus=str(rc),
            )
        return props

    def journal_lines(self, since):
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        self.offset += len(data)
        text = self.partial + data.decode("utf-8", "replace").replace("\r", "\n")
        lines = text.split("\n")
        self.partial = lines.pop()
        return lines

    def kernel_lines(self, since):
        return []  # no kernel log on the device; a host OOM is not among these scenarios

    def request(self, method, path, body=None, timeout=10.0, auth=False):
        if self.before_request:
            self.before_request(method, path)
        return super().request(method, path, body, timeout, auth)


def gate_params(**overrides):
    params = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    lang = sl.Language()
    prompts = sl.greedy_prompts(lang)
    params.update(
        poll_interval=1.0,
        start_timeout=400,
        no_progress_timeout=120,
        request_timeout=60,
        chat_prompt=prompts[10],
        prompts=prompts[:4],
        max_tokens=64,
    )
    params.update(overrides)
    return params


def write_merged(path, document):
    """The gate writes the whole document it read; gates of several servers share these files here, so
    merge: a baseline key (or the metrics records) from this run replaces that key only."""
    with LOCK:
        current = None
        if os.path.exists(path):
            with open(path) as handle:
                current = json.load(handle)
        if current and "baselines" in document:
            merged = dict(current.get("baselines") or {})
            merged.update(document["baselines"])
            document = dict(document, baselines=merged)
        elif current and "records" in document:
            seen = {json.dumps(r, sort_keys=True) for r in document["records"]}
            document = dict(
                document,
                records=[r for r in current.get("records", []) if json.dumps(r, sort_keys=True) not in seen]
                + document["records"],
            )
        with open(path, "w") as handle:
            json.dump(document, handle, indent=2, sort_keys=True)


def run_gate(label, server, io, **overrides):
    params = gate_params(name=server.name, release_id=label, **overrides)
    warnings = []
    started = time.time()
    try:
        gate = health_gate.HealthGate(params, io, warn=warnings.append, write=write_merged)
        io.gate = gate
        passed, message, result = gate.run()
    except Exception:  # noqa: BLE001 (a harness error is recorded, the other scenarios go on)
        passed, message, result = None, traceback.format_exc(), {}
    entry = {
        "server": server.name,
        "algorithm": server.algo,
        "release": server.info.get("release"),
        "passed": passed,
        "message": message,
        "warnings": warnings,
        "wall_s": round(time.time() - started, 1),
        "result": result,
    }
    with LOCK:
        RESULTS[label] = entry
        dump()
    log("%s: %s" % (label, message[:400] if message else message))
    return entry


def dump():
    with open(os.path.join(OUT, "gate-results.json"), "w") as handle:
        json.dump(RESULTS, handle, indent=1, sort_keys=True, default=str)


class Server(scenario.Server):
    def __init__(self, name, algo, release, port, models, extra=(), drop=()):
        super().__init__(name, algo, release, port, OUT, models)
        self.args = [a for a in self.args if a not in drop] + list(extra)
        # GATE_LAUNCH_MODULE=ddtree_lab_runtime tries this script on a CPU machine against the lab runtime.
        # (GATE_SERVER_PYTHON: that stack's Python, when the one running this script is another).
        self.args[2] = os.environ.get("GATE_LAUNCH_MODULE", self.args[2])
        self.args[0] = os.environ.get("GATE_SERVER_PYTHON", self.args[0])
        self.info["flags"] = self.args[3:]

    def start(self):
        self.t0_monotonic = time.monotonic()
        super().start()

    def kill_tree(self):
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(20)
            except Exception:  # noqa: BLE001
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except Exception:  # noqa: BLE001 (already gone)
            pass
        try:
            self.log.close()
        except Exception:  # noqa: BLE001
            pass


def children(pid):
    out = subprocess.run(
        ["ps", "-o", "pid=,args=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    ).stdout
    return [
        (int(line.split(None, 1)[0]), line.split(None, 1)[1] if " " in line.strip() else "")
        for line in out.splitlines()
        if line.strip()
    ]


def log_path(server):
    return os.path.join(OUT, "server-%s.log" % server.name)


def guarded(fn):
    def wrapper(*args):
        try:
            fn(*args)
        except Exception:  # noqa: BLE001
            with LOCK:
                RESULTS.setdefault("_errors", []).append(traceback.format_exc())
                dump()
            log(traceback.format_exc())

    return wrapper


DFLASH_RECORDED = threading.Event()
SERVERS = {}
BASELINE = None


@guarded
def healthy(server, label, after=None):
    if after is not None:
        after.wait(240)
    run_gate(
        label,
        server,
        ProcessIO(server, log_path(server)),
        baseline_file=BASELINE,
        metrics_file=METRICS,
        record_metrics=True,
    )


@guarded
def wave1_dflash(server):
    try:
        run_gate(
            "dflash",
            server,
            ProcessIO(server, log_path(server)),
            baseline_file=BASELINE,
            metrics_file=METRICS,
            record_metrics=True,
        )
    finally:
        DFLASH_RECORDED.set()
    # A second run in which the scheduler (a child of the launcher) is SIGKILLed just before the first
    # baseline request (the second chat request of a run): what the gate reports when a running server
    # loses its scheduler.
    io = ProcessIO(server, log_path(server))
    io.offset = os.path.getsize(log_path(server))
    posts = []

    def kill_scheduler(method, path):
        if method != "POST":
            return
        posts.append(path)
        if len(posts) == 2:
            victims = children(server.proc.pid)
            with LOCK:
                RESULTS["_killed_scheduler"] = victims
            for pid, _args in victims:
                os.kill(pid, signal.SIGKILL)
            time.sleep(2)

    io.before_request = kill_scheduler
    run_gate("dflash-scheduler-killed", server, io, baseline_file=BASELINE, since="now")
    time.sleep(5)
    RESULTS["dflash-scheduler-killed"]["after_5s"] = {
        "launcher_rc": server.proc.poll(),
        "children": children(server.proc.pid),
    }


@guarded
def wave2_ddtree(server):
    DFLASH_RECORDED.wait(300)
    # Its own metrics file: the previous release of this service was DDTREE too (DDTREE's tokens/s are
    # not DFLASH's: docs/health-gate.md compares them from the recorded numbers).
    io = ProcessIO(server, log_path(server))
    metrics = os.path.join(OUT, "metrics-ddtree.json")
    run_gate("ddtree", server, io, baseline_file=BASELINE, metrics_file=metrics, record_metrics=True)
    try:
        summary = record_conformance.record_all("http://127.0.0.1:%d" % server.port, os.path.join(OUT, "conformance"))
        RESULTS["_conformance"] = summary
    except Exception:  # noqa: BLE001
        RESULTS["_conformance_error"] = traceback.format_exc()
    extra = {}
    try:
        info = server.post(
            "/generate",
            {"text": gate_params()["prompts"][0], "sampling_params": {"temperature": 0, "max_new_tokens": 64}},
        )
        extra["generate_meta_info"] = info.get("meta_info")
    except Exception as exc:  # noqa: BLE001
        extra["generate_error"] = repr(exc)
    try:
        import urllib.request

        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % server.port, timeout=30) as answer:
            text = answer.read().decode("utf-8", "replace")
        extra["metrics_spec_lines"] = [line for line in text.splitlines() if "spec" in line.lower()][:80]
        extra["metrics_status"] = answer.status
    except Exception as exc:  # noqa: BLE001
        extra["metrics_error"] = repr(exc)
    for other in ("none", "dflash"):
        try:
            extra["server_info_" + other] = SERVERS[other].get("/server_info")
        except Exception as exc:  # noqa: BLE001
            extra["server_info_%s_error" % other] = repr(exc)
    RESULTS["_ddtree_meta_info"] = extra
    io2 = ProcessIO(server, log_path(server))
    io2.offset = os.path.getsize(log_path(server))
    run_gate(
        "ddtree-again", server, io2, baseline_file=BASELINE, metrics_file=metrics, record_metrics=True, since="now"
    )


@guarded
def wave2_lossy(server):
    DFLASH_RECORDED.wait(300)
    run_gate("ddtree-lossy", server, ProcessIO(server, log_path(server)), baseline_file=BASELINE)


@guarded
def wave2_killed(server):
    """SIGKILL the launcher once the target's weights are loaded, while the gate watches the start."""

    def killer():
        deadline = time.time() + 200
        while time.time() < deadline:
            try:
                with open(log_path(server)) as handle:
                    if "Load weight end" in handle.read():
                        break
            except OSError:
                pass
            time.sleep(0.5)
        RESULTS["_killed_at_s"] = round(time.monotonic() - server.t0_monotonic, 1)
        os.kill(server.proc.pid, signal.SIGKILL)

    threading.Thread(target=killer, daemon=True).start()
    run_gate("ddtree-killed", server, ProcessIO(server, log_path(server)), baseline_file=BASELINE)


@guarded
def crash_radix(server):
    run_gate("none-radix-cache", server, ProcessIO(server, log_path(server)), baseline_file=None, start_timeout=200)


def kill_in_baseline(label, server, io, victim):
    """A before_request hook: SIGKILL the launcher (victim "launcher") or its scheduler ("scheduler")
    just before the gate's first baseline generation (its first POST in the baseline stage)."""

    def hook(method, path):
        if label in KILLS or method != "POST" or io.gate is None or io.gate.stage != "baseline":
            return
        pids = (
            [server.proc.pid]
            if victim == "launcher"
            else [pid for pid, args in children(server.proc.pid) if "scheduler" in args]
        )
        KILLS[label] = {
            "victim": victim,
            "pids": pids,
            "children_before": children(server.proc.pid),
            "at_s": round(time.monotonic() - server.t0_monotonic, 1),
            "gate_stage": io.gate.stage,
            "monotonic": time.monotonic(),
        }
        for pid in pids:
            os.kill(pid, signal.SIGKILL)

    return hook


KILLS = {}


@guarded
def killed_in_baseline(server, victim):
    label = "ddtree-%s-killed" % victim
    io = ProcessIO(server, log_path(server))
    io.before_request = kill_in_baseline(label, server, io, victim)
    entry = run_gate(label, server, io, baseline_file=BASELINE)
    kill = KILLS.get(label, {})
    kill["verdict_after_kill_s"] = round(time.monotonic() - kill.pop("monotonic", time.monotonic()), 1)
    kill["launcher_rc_at_verdict"] = server.proc.poll()
    entry["kill"] = kill
    with LOCK:
        dump()


@guarded
def healthy_then_short_timeout(server):
    first = run_gate(
        "ddtree",
        server,
        ProcessIO(server, log_path(server)),
        baseline_file=BASELINE,
        metrics_file=METRICS,
        record_metrics=True,
    )
    io = ProcessIO(server, log_path(server))
    io.offset = os.path.getsize(log_path(server))
    # The served model name given, so the first request the short timeout fails is the chat completion.
    model = ((first.get("result") or {}).get("chat") or {}).get("model")
    entry = run_gate(
        "ddtree-request-timeout", server, io, baseline_file=BASELINE, since="now", request_timeout=0.001, model=model
    )
    entry["launcher_rc_at_verdict"] = server.proc.poll()
    with LOCK:
        dump()


def server_info_states(server):
    """/server_info's internal_states[0] and how many "Decode batch" lines (one per decode_log_interval
    decode batches) the server has logged so far."""
    with open(log_path(server), errors="replace") as handle:
        decode_lines = handle.read().count("Decode batch")
    try:
        states = (server.get("/server_info").get("internal_states") or [{}])[0]
    except Exception as exc:  # noqa: BLE001
        states = {"error": repr(exc)}
    return {"avg_spec_accept_length": states.get("avg_spec_accept_length"), "decode_batch_log_lines": decode_lines}


@guarded
def fresh_then_again(server):
    """A fresh DDTREE server gated from its start with an acceptance-length floor (its /server_info has no
    average yet), then gated again on the same server."""
    for label, since in (("ddtree-fresh", None), ("ddtree-again", "now")):
        io = ProcessIO(server, log_path(server))
        if since:
            io.offset = os.path.getsize(log_path(server))
        entry = run_gate(
            label,
            server,
            io,
            baseline_file=BASELINE,
            metrics_file=METRICS,
            record_metrics=True,
            min_accept_length=2.0,
            **({"since": since} if since else {}),
        )
        entry["after"] = server_info_states(server)
        with LOCK:
            dump()


def plan_fresh(models, release, servers, threads):
    # GATE_EXTRA_FLAGS: more launch flags (on a CPU try against the lab runtime, whose acceptance is lower
    # than the tiny model's on the GPU, "--decode-log-interval 200" keeps /server_info's average away).
    server = Server("ddtree", "DDTREE", release, 31030, models, extra=os.environ.get("GATE_EXTRA_FLAGS", "").split())
    server.start()
    servers.append(server)
    threads.append(threading.Thread(target=fresh_then_again, args=(server,)))
    threads[-1].start()


def plan_killed(models, release, servers, threads):
    plan = [
        (Server("ddtree", "DDTREE", release, 31020, models), healthy_then_short_timeout, ()),
        (Server("ddtree-launcher-killed", "DDTREE", release, 31021, models), killed_in_baseline, ("launcher",)),
        (Server("ddtree-scheduler-killed", "DDTREE", release, 31022, models), killed_in_baseline, ("scheduler",)),
    ]
    for server, fn, extra in plan:
        server.start()
        servers.append(server)
        threads.append(threading.Thread(target=fn, args=(server,) + extra))
        threads[-1].start()


def wait_started(servers, limit):
    """Until each server has logged "fired up" (its warm-up ran, so its JIT kernels are in the shared
    cache for the next wave) or exited."""
    start = time.time()
    while time.time() - start < limit:
        pending = []
        for server in servers:
            try:
                with open(log_path(server)) as handle:
                    up = "fired up" in handle.read()
            except OSError:
                up = False
            if server.proc.poll() is None and not up:
                pending.append(server)
        if not pending:
            return
        time.sleep(1)


# The tiny target's word-level tokenizer has no chat template, and SGLang answers a chat request without
# one with 400 "Cannot use chat template functions because tokenizer.chat_template is not set". The gate
# talks chat, so the copy the servers load gets the plainest template: the messages'
# contents, space-separated (the chat prompt is then the language's own words).
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% if not loop.last %} {% endif %}{% endfor %}"


def with_chat_template(models):
    target = "/tmp/gs-gate/models"
    if not os.path.isdir(target):
        shutil.copytree(models, target)
        path = os.path.join(target, "tiny-qwen3", "tokenizer_config.json")
        with open(path) as handle:
            config = json.load(handle)
        config["chat_template"] = CHAT_TEMPLATE
        with open(path, "w") as handle:
            json.dump(config, handle, indent=1)
    return target


def plan_waves(models, release, lossy, servers, threads):
    none = Server("none", "NONE", release, 31000, models)
    dflash = Server("dflash", "DFLASH", release, 31001, models)
    radix = Server("none-radix-cache", "NONE", release, 31002, models, drop=("--disable-radix-cache",))
    wave1 = [(none, healthy, ("none",)), (dflash, wave1_dflash, ())]
    if os.environ.get("GATE_CRASHES", "1") == "1":
        wave1.append((radix, crash_radix, ()))
    for server, fn, extra in wave1:
        SERVERS[server.name] = server
        server.start()
        servers.append(server)
        threads.append(threading.Thread(target=fn, args=(server,) + extra))
        threads[-1].start()
    if os.environ.get("GATE_WAVES", "2") == "2":
        wait_started([none, dflash], 200)
    log("wave 1 up")
    ddtree = Server("ddtree", "DDTREE", release, 31010, models)
    lossy_server = Server("ddtree-lossy", "DDTREE", lossy, 31011, models)
    killed = Server("ddtree-killed", "DDTREE", release, 31012, models)
    wave2 = [(ddtree, wave2_ddtree), (lossy_server, wave2_lossy)]
    if os.environ.get("GATE_CRASHES", "1") == "1":
        wave2.append((killed, wave2_killed))
    for server, fn in wave2:
        server.start()
        servers.append(server)
        threads.append(threading.Thread(target=fn, args=(server,)))
        threads[-1].start()


def main():
    global OUT, BASELINE, METRICS
    OUT, models = sys.argv[1], sys.argv[2]
    os.makedirs(OUT, exist_ok=True)
    BASELINE, METRICS = os.path.join(OUT, "baseline.json"), os.path.join(OUT, "metrics.json")
    models = with_chat_template(models)
    release, lossy = scenario.RELEASE, "/tmp/release-greedy-lossy/site"
    if not os.path.isdir(lossy):
        shutil.copytree(release, lossy)
        subprocess.run(
            [
                sys.executable,
                os.path.join(HERE, "plant_greedy_lossy_walk.py"),
                os.path.join(lossy, "sglang_overlay", "adapter", "worker.py"),
            ],
            check=False,
        )
    servers = []
    try:
        threads = []
        if os.environ.get("GATE_PLAN") == "killed":
            plan_killed(models, release, servers, threads)
        elif os.environ.get("GATE_PLAN") == "fresh":
            plan_fresh(models, release, servers, threads)
        else:
            plan_waves(models, release, lossy, servers, threads)
        deadline = float(os.environ.get("GATE_LIMIT", "400"))
        for thread in threads:
            thread.join(max(1.0, deadline - (time.time() - T0)))
        log("all runs done" if not any(t.is_alive() for t in threads) else "time is up")
    finally:
        for server in servers:
            server.kill_tree()
        with LOCK:
            RESULTS["_servers"] = {
                s.name: dict(s.info, returncode=s.proc.returncode if s.proc else None) for s in servers
            }
            RESULTS["_wall_s"] = round(time.time() - T0, 1)
            dump()
    log("done")
    os._exit(0)


if __name__ == "__main__":
    main()
