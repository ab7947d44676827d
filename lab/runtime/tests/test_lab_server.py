"""The lab runtime as a process: SGLang's startup, HTTP surface, speculative decoding, incident, faults.

Every server of this module is started at once (module fixture) on a free loopback port, with the
real SGLang 0.5.23 of the test venv and the runtime's environment shaped like the lab stack (no
transformers, no torchvision). Each test then talks HTTP to one of them.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error

import pytest

from ._harness import DRAFT, Runtime, make_broken_plugin, make_lab_stack_shadow

# Whether the test venv has SGLang, without importing it here: the runtimes are subprocesses, and
# SGLang imports torch and (installed in the test venv) transformers, ~8 CPU s in every xdist worker,
# each of which collects this file. A broken SGLang still fails every runtime below.
if importlib.util.find_spec("sglang") is None:
    pytest.skip("could not import 'sglang': not installed", allow_module_level=True)
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

pytestmark = pytest.mark.slow  # starts lab runtime servers

KEY = "lab-secret"
PROMPTS = [
    "The capital city of France is",
    "Tell me about the old library and its maps.",
    "A careful rollout starts with",
]
REPO = pathlib.Path(__file__).resolve().parents[3]
LAB_NVIDIA_SMI = REPO / "lab" / "nvidia-smi" / "nvidia-smi"
GPU_MODELS = REPO / "lab" / "nvidia-smi" / "gpu-models.json"

SPEC = ["--speculative-draft-model-path", DRAFT]
FLEET = {
    # name: (flags, env, needs the broken plugin)
    "none": (["--enable-metrics", "--api-key", KEY, "--served-model-name", "lab-8b"], {}, False),
    "ddtree": (
        ["--enable-metrics", "--speculative-algorithm", "DDTREE", *SPEC, "--speculative-ddtree-budget", "10"],
        {"SGLANG_DDTREE_TOP_K": "4"},
        False,
    ),
    "dflash": (["--speculative-algorithm", "DFLASH", *SPEC], {}, False),
    "eagle": (["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "/models/lab-eagle"], {}, False),
    "nextn": (["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2"], {}, False),
    "incident": (["--speculative-algorithm", "DDTREE", *SPEC], {"SGLANG_PLUGINS": "broken"}, True),
    "crash_at_start": ([], {"LAB_RUNTIME_FAULT": "crash_at_start"}, False),
    "crash_after": ([], {"LAB_RUNTIME_FAULT": "crash_after:1"}, False),
    "hang": ([], {"LAB_RUNTIME_FAULT": "hang", "SGLANG_HEALTH_CHECK_TIMEOUT": "2"}, False),
    "slow": (
        [],
        {"LAB_RUNTIME_FAULT": "slow:25", "CUDA_VISIBLE_DEVICES": "3,1", "LAB_RUNTIME_DRAIN_SECONDS": "8"},
        False,
    ),
    "degenerate": ([], {"LAB_RUNTIME_FAULT": "degenerate", "LAB_RUNTIME_LOAD_SECONDS": "2"}, False),
    "bad_flag": (["--no-such-flag", "1"], {}, False),
    "unknown_algorithm": (["--speculative-algorithm", "FOO", *SPEC], {}, False),
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lab_runtime")
    shadow = make_lab_stack_shadow(tmp)
    broken = make_broken_plugin(tmp)
    runtimes = {}
    try:
        for name, (flags, env, needs_broken) in FLEET.items():
            path = [shadow, broken] if needs_broken else [shadow]
            runtimes[name] = Runtime(name, tmp, flags, env=env, pythonpath=path)
        yield runtimes
    finally:
        for runtime in runtimes.values():
            runtime.kill()


def ready(fleet, name) -> Runtime:
    runtime = fleet[name]
    assert runtime.wait_for("The server is fired up and ready to roll!"), runtime.log()[-4000:]
    return runtime


def marker_positions(log: str, *markers: str) -> list:
    return [log.find(m) for m in markers]


# ---- startup ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["none", "ddtree"])
def test_startup_markers_in_sglang_order(fleet, name):
    runtime = ready(fleet, name)
    log = runtime.log()
    positions = marker_positions(
        log,
        "Load weight begin",
        "Load weight end",
        f"Uvicorn running on http://127.0.0.1:{runtime.port}",
        "The server is fired up and ready to roll!",
    )
    assert all(p >= 0 for p in positions), log[-3000:]
    assert positions == sorted(positions), positions


def test_port_opens_only_after_load(fleet):
    runtime = fleet["degenerate"]  # LAB_RUNTIME_LOAD_SECONDS=2
    assert runtime.wait_for("Load weight begin"), runtime.log()
    if "Load weight end" not in runtime.log():
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", runtime.port), timeout=1).close()
    ready(fleet, "degenerate")
    socket.create_connection(("127.0.0.1", runtime.port), timeout=2).close()


def test_bad_flag_exits_2_like_sglang(fleet):
    runtime = fleet["bad_flag"]
    assert runtime.wait_exit() == 2
    log = runtime.log()
    assert "unrecognized arguments: --no-such-flag 1" in log
    assert "Load weight begin" not in log


def test_unknown_algorithm_fails_with_sglang_error(fleet):
    runtime = fleet["unknown_algorithm"]
    code = runtime.wait_exit()
    assert code not in (None, 0)
    log = runtime.log()
    assert "Traceback (most recent call last)" in log
    assert "ValueError: Unknown speculative algorithm name: FOO" in log
    assert "Uvicorn running" not in log


# ---- HTTP surface ------------------------------------------------------------------------------


def test_models_info_and_health_endpoints(fleet):
    rt = ready(fleet, "none")
    models = rt.get("/v1/models", key=KEY)
    assert models.status == 200
    card = models.json()["data"][0]
    assert card["id"] == "lab-8b" and card["max_model_len"] == 8192
    assert rt.get("/v1/models/lab-8b", key=KEY).status == 200
    assert rt.get("/v1/models/other", key=KEY).status == 404
    info = rt.get("/model_info", key=KEY).json()
    assert info["served_model_name"] == "lab-8b" and info["is_generation"] is True
    assert rt.get("/ready").status == 200
    health = rt.get("/health")
    assert health.status == 200 and health.elapsed >= 0.9  # it generated (SGLang polls every 1 s)
    assert rt.get("/health_generate").status == 200
    server = rt.get("/server_info", key=KEY).json()
    assert server["served_model_name"] == "lab-8b" and server["speculative_algorithm"] is None
    assert server["version"] == "0.5.23" and server["port"] == rt.port
    assert "avg_spec_accept_length" not in server["internal_states"][0]
    assert server["internal_states"][0]["lab_runtime"]["decoder"] == "none"


def test_generation_endpoints_native_and_openai(fleet):
    rt = ready(fleet, "none")
    native = rt.generate(PROMPTS[0], max_new_tokens=40, key=KEY)
    assert set(native) >= {"text", "meta_info"}
    meta = native["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 40}
    assert meta["completion_tokens"] == 40 and meta["prompt_tokens"] == len(PROMPTS[0])
    assert len(native["text"]) > 20 and len(set(native["text"])) > 8

    comp = rt.post(
        "/v1/completions", {"model": "lab-8b", "prompt": PROMPTS[0], "max_tokens": 40, "temperature": 0}, key=KEY
    ).json()
    assert comp["object"] == "text_completion" and comp["choices"][0]["text"] == native["text"]
    assert comp["usage"]["completion_tokens"] == 40

    messages = [{"role": "user", "content": "Tell me about the river."}]
    chat = rt.post(
        "/v1/chat/completions", {"model": "lab-8b", "messages": messages, "max_tokens": 60, "temperature": 0}, key=KEY
    ).json()
    content = chat["choices"][0]["message"]["content"]
    assert chat["object"] == "chat.completion" and chat["choices"][0]["finish_reason"] == "length"
    assert len(content) > 20 and len(set(content)) > 8

    streamed = rt.post(
        "/v1/chat/completions", {"messages": messages, "max_tokens": 60, "temperature": 0, "stream": True}, key=KEY
    )
    events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == content
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"

    # stop strings, sampling (seeded: reproducible), errors
    word = native["text"].split()[1]
    stopped = rt.generate(PROMPTS[0], max_new_tokens=40, key=KEY, stop=[word])
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert word not in stopped["text"] and native["text"].startswith(stopped["text"])
    s1 = rt.generate(PROMPTS[1], max_new_tokens=40, key=KEY, temperature=1.0, sampling_seed=7)["text"]
    s2 = rt.generate(PROMPTS[1], max_new_tokens=40, key=KEY, temperature=1.0, sampling_seed=7)["text"]
    greedy = rt.generate(PROMPTS[1], max_new_tokens=40, key=KEY)["text"]
    assert s1 == s2 and s1 != greedy
    assert rt.post("/generate", {"sampling_params": {}}, key=KEY).status == 400
    too_long = rt.post("/v1/completions", {"prompt": "x", "max_tokens": 100000}, key=KEY)
    assert too_long.status == 400 and "maximum context length" in too_long.json()["message"]


def test_api_key_like_sglang(fleet):
    rt = ready(fleet, "none")
    for method, path, payload in [
        ("GET", "/v1/models", None),
        ("GET", "/server_info", None),
        ("GET", "/model_info", None),
        ("POST", "/generate", {"text": "hi"}),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ]:
        for key in (None, "wrong"):
            res = rt.request(method, path, payload, key=key)
            assert res.status == 401 and res.json() == {"error": "Unauthorized"}, (path, key, res.status)
    assert rt.get("/health").status == 200
    assert rt.get("/ready").status == 200
    metrics = rt.get("/metrics")
    assert metrics.status == 200 and "sglang:gen_throughput{" in metrics.text


def test_server_args_line_shows_the_api_key_like_sglang(fleet):
    """SGLang 0.5.23 logs every resolved field at start-up, the API key in clear; so does the lab, or the
    collection's secrets test (tests/gitops/test_secrets.py) could not see a leak into the journal."""
    line = next(line for line in ready(fleet, "none").log().splitlines() if "server_args=" in line)
    assert "server_args={" in line and "'api_key': '%s'" % KEY in line and "'served_model_name': 'lab-8b'" in line


# ---- speculative decoding: lossless, with real acceptance -----------------------------------------


@pytest.fixture(scope="module")
def reference(fleet):
    rt = ready(fleet, "none")
    return {p: rt.generate(p, max_new_tokens=120, key=KEY) for p in PROMPTS}


@pytest.mark.parametrize("name", ["ddtree", "dflash", "eagle", "nextn"])
def test_greedy_output_equals_plain_decoding(fleet, reference, name):
    rt = ready(fleet, name)
    for prompt, ref in reference.items():
        out = rt.generate(prompt, max_new_tokens=120)
        assert out["output_ids"] == ref["output_ids"], (name, prompt)
        assert out["text"] == ref["text"]
        assert len(set(out["text"])) > 8  # not degenerate
        meta = out["meta_info"]
        assert 0 < meta["spec_verify_ct"] < 119  # speculative steps ran, and they accepted drafts
        assert 1.0 < meta["spec_accept_length"]


EXPECT = {
    # name: (algorithm /server_info reports, decoder, budget, top_k, num_draft_tokens)
    "ddtree": ("DFLASH", "ddtree", 10, 4, 16),
    "dflash": ("DFLASH", "dflash", 15, 1, 16),
    "eagle": ("EAGLE", "eagle", 3, 1, 4),
    "nextn": ("EAGLE", "eagle", 2, 1, 3),
}


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_acceptance_reported_like_sglang(fleet, reference, name):
    rt = ready(fleet, name)
    # SGLang 0.5.23: /server_info's average exists only once decode_log_interval (40) decode batches ran;
    # each request's meta_info has its own from the first verify step. Checked at every read, from
    # whatever this server served before.
    for _ in range(20):
        meta = rt.generate(PROMPTS[0], max_new_tokens=120)["meta_info"]
        assert 1.0 < meta["spec_accept_length"]
        state = rt.get("/server_info").json()["internal_states"][0]
        lab = state["lab_runtime"]
        assert lab["decode_log_interval"] == 40
        assert ("avg_spec_accept_length" in state) == (lab["decode_batches"] >= 40), lab
        if "avg_spec_accept_length" in state:
            break
    info = rt.get("/server_info").json()
    algorithm, decoder, budget, top_k, window = EXPECT[name]
    assert info["speculative_algorithm"] == algorithm
    assert info["speculative_num_draft_tokens"] == window
    state = info["internal_states"][0]
    lab = state["lab_runtime"]
    assert (lab["decoder"], lab["budget"], lab["top_k"], lab["num_draft_tokens"]) == (decoder, budget, top_k, window)
    assert 1.0 < state["avg_spec_accept_length"] < window  # drafts accepted, not all of them
    assert 0.0 < lab["spec_accept_rate"] < 1.0
    assert "Decode batch, #running-req: 1, " in rt.log()  # SGLang's line, logged at each fold


def test_ddtree_metrics(fleet, reference):
    rt = ready(fleet, "ddtree")
    for _ in range(20):  # until SGLang's decode log line was written once
        rt.generate(PROMPTS[2], max_new_tokens=60)
        if "accept len: " in rt.log():
            break
    log = rt.log()
    assert "DDTREE: resolving as DFLASH" in log and "DDTREE: budget=10, top_k=4" in log
    values = {}
    for line in rt.get("/metrics").text.splitlines():
        if line.startswith("sglang:") and "{" in line:
            values[line.split("{")[0]] = float(line.rsplit(" ", 1)[1])
    # SGLang's gauges hold the last logged window (the "Decode batch" line), not the server's average.
    last = log.rsplit("accept len: ", 1)[1]
    logged_length, logged_rate = float(last.split(",")[0]), float(last.split("accept rate: ")[1].split(",")[0])
    assert values["sglang:spec_accept_length"] == pytest.approx(logged_length, abs=0.005)
    assert values["sglang:spec_accept_rate"] == pytest.approx(logged_rate, abs=0.005) and 0.0 < logged_rate < 1.0
    assert values["sglang:gen_throughput"] > 0


# ---- the incident --------------------------------------------------------------------------------


def test_incident_broken_plugin_gives_bangs_while_models_and_health_answer(fleet):
    rt = ready(fleet, "incident")
    assert rt.get("/v1/models").status == 200
    assert rt.get("/health").status == 200  # health only needs one token
    chat = rt.post(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 24, "temperature": 0},
    ).json()
    assert chat["choices"][0]["message"]["content"] == "!" * 24
    assert rt.generate(PROMPTS[0], max_new_tokens=16)["text"] == "!" * 16
    info = rt.get("/server_info").json()
    assert info["speculative_algorithm"] == "DDTREE"  # never resolved to DFLASH: the adapter is not there
    lab = info["internal_states"][0]["lab_runtime"]
    assert lab["decoder"] == "no_hidden_capture" and lab["target_hidden_state_capture"] is False


# ---- faults ----------------------------------------------------------------------------------------


def _assert_sglang_fatal(runtime: Runtime) -> str:
    assert runtime.wait_exit() == -signal.SIGKILL  # systemd: status=9/KILL
    log = runtime.log()
    positions = marker_positions(
        log, "Scheduler hit an exception", "Traceback (most recent call last)", "Received sigquit from a child process"
    )
    assert all(p >= 0 for p in positions) and positions == sorted(positions), log[-3000:]
    return log


def test_fault_crash_at_start(fleet):
    runtime = fleet["crash_at_start"]
    log = _assert_sglang_fatal(runtime)
    assert "Load weight begin" in log and "RuntimeError: lab fault crash_at_start" in log
    assert "Uvicorn running" not in log


def test_fault_crash_after(fleet):
    rt = ready(fleet, "crash_after")
    assert rt.get("/health").status == 200  # health checks do not count
    assert rt.generate(PROMPTS[0], max_new_tokens=8)["meta_info"]["completion_tokens"] == 8
    with pytest.raises((urllib.error.URLError, http.client.HTTPException, ConnectionError, OSError)):
        rt.generate(PROMPTS[1], max_new_tokens=8)
    log = _assert_sglang_fatal(rt)
    assert "lab fault crash_after:1" in log


def test_fault_hang(fleet):
    rt = ready(fleet, "hang")
    models = rt.get("/v1/models")
    assert models.status == 200 and models.elapsed < 3.0  # answered from memory
    health = rt.get("/health", timeout=15)
    assert health.status == 503 and 1.5 < health.elapsed < 10
    with pytest.raises((TimeoutError, urllib.error.URLError, OSError)):
        rt.generate(PROMPTS[0], max_new_tokens=4, timeout=2)
    assert "Health check failed" in rt.log()
    assert rt.get("/v1/models").status == 200


def test_fault_degenerate(fleet):
    rt = ready(fleet, "degenerate")
    assert rt.generate(PROMPTS[1], max_new_tokens=20)["text"] == "!" * 20
    assert rt.get("/health").status == 200


def _lab_nvidia_smi_pids(tmp_path) -> set:
    config = tmp_path / "nvidia-smi.json"
    models = json.loads(GPU_MODELS.read_text())
    config.write_text(
        json.dumps({"model": models["rtx-a6000"], "count": 4, "driver_version": "580.159.04", "cuda_version": "13.0"})
    )
    out = subprocess.run(
        [sys.executable, str(LAB_NVIDIA_SMI), "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "LAB_NVIDIA_SMI_CONFIG": str(config)},
    )
    return {int(line.split(",")[0]) for line in out.stdout.splitlines() if line.strip()}


def test_fault_slow_then_sigterm_drains_and_exits_0(fleet, tmp_path):
    rt = ready(fleet, "slow")  # slow:25, CUDA_VISIBLE_DEVICES=3,1
    # GPU presence: re-executed once with LAB_NVIDIA_GPUS from CUDA_VISIBLE_DEVICES (tp 1 -> GPU 3), same PID
    environ = pathlib.Path(f"/proc/{rt.pid}/environ").read_bytes().split(b"\0")
    assert b"LAB_NVIDIA_GPUS=3" in environ
    if LAB_NVIDIA_SMI.exists():
        assert rt.pid in _lab_nvidia_smi_pids(tmp_path)

    timed = rt.generate(PROMPTS[2], max_new_tokens=20)
    assert timed["meta_info"]["e2e_latency"] >= 20 * 0.025

    result = {}

    def long_request():
        result["out"] = rt.generate(PROMPTS[0], max_new_tokens=80)  # ~2 s at 25 ms/token

    worker = threading.Thread(target=long_request)
    worker.start()
    time.sleep(0.5)
    rt.terminate()
    worker.join(20)
    assert result["out"]["meta_info"]["completion_tokens"] == 80  # in-flight request finished
    assert rt.wait_exit(20) == 0
    assert "Gracefully exiting" in rt.log()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", rt.port), timeout=1).close()
    if LAB_NVIDIA_SMI.exists():
        assert rt.pid not in _lab_nvidia_smi_pids(tmp_path)
