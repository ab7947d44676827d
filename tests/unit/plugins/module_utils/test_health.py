"""The health gate's rules on real-looking SGLang 0.5.23 journals, unit states and outputs."""

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils import health
from ansible_collections.ddtree.sglang.plugins.module_utils.health import (
    StartWatch,
    baseline_add,
    baseline_lookup,
    classify_unit,
    compare_metrics,
    compare_output,
    degenerate_output,
    diagnose_failure,
    exception_summary,
    kernel_oom_lines,
    match_signatures,
    metrics_add,
    parse_systemctl_show,
    previous_metrics,
    redact,
    split_journal_output,
    tokens_per_second,
)

UNIT = "sglang-coder.service"
SITE = "/opt/sglang/services/coder/current/stack/lib/python3.11/site-packages"

# Journal lines longer than the line limit, spliced into the excerpts below.
LONG_LINES = {
    "server_args": "[2026-11-30 10:00:01] server_args=ServerArgs(model_path='/models/Qwen3-8B', served_model_name='coder', "
                   "speculative_algorithm='DDTREE', speculative_draft_model_path='/models/Qwen3-8B-DFlash-b16', "
                   "speculative_ddtree_budget=64, port=30000, ...)",
    "capacity": "[2026-11-30 10:00:23 TP0] max_total_num_tokens=412160, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                "max_running_requests=48, context_len=40960, available_gpu_mem=11.53 GB",
    "oom_kill": "Nov 30 10:00:09.101302 ct200 kernel: oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0-1,"
                "oom_memcg=/system.slice/sglang-coder.service,task_memcg=/system.slice/sglang-coder.service,task=python,pid=4182,uid=999",
    "memcg": "Nov 30 10:00:09.101311 ct200 kernel: Memory cgroup out of memory: Killed process 4182 (python) total-vm:95034112kB, "
             "anon-rss:64201728kB, file-rss:524288kB, shmem-rss:0kB, UID:999 pgtables:128000kB oom_score_adj:0",
}


def splice(text):
    for name, line in LONG_LINES.items():
        text = text.replace("<%s>" % name, line)
    return text


# `journalctl -u sglang-coder.service -o cat` of a good DDTree start (target + DFlash draft).
GOOD_START = splice("""\
<server_args>
[2026-11-30 10:00:02] Loaded plugin ddtree from group sglang.srt.plugins
[2026-11-30 10:00:05 TP0] Init torch distributed begin.
[2026-11-30 10:00:06 TP0] Init torch distributed ends. elapsed=0.41 s, mem usage=0.09 GB
[2026-11-30 10:00:06 TP0] Load weight begin. avail mem=93.12 GB
Loading safetensors checkpoint shards:   0% Completed | 0/5 [00:00<?, ?it/s]
Loading safetensors checkpoint shards: 100% Completed | 5/5 [00:04<00:00,  1.10it/s]
[2026-11-30 10:00:11 TP0] Load weight end. elapsed=4.71 s, type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=77.80 GB, mem usage=15.32 GB.
[2026-11-30 10:00:11 TP0] Load weight begin. avail mem=77.80 GB
[2026-11-30 10:00:12 TP0] Load weight end. elapsed=0.92 s, type=DFlashDraftModel, dtype=torch.bfloat16, avail mem=76.61 GB, mem usage=1.19 GB.
[2026-11-30 10:00:12 TP0] Memory pool end. avail mem=12.40 GB
[2026-11-30 10:00:13 TP0] Capture target decode CUDA graph begin. backend=flashinfer, bs=[1, 2, 4, 8, 16, 24, 32, 40, 48], avail mem=12.11 GB
Capturing batches (bs=48 avail_mem=12.11 GB): 100%|██████████| 9/9 [00:09<00:00,  1.01s/it]
[2026-11-30 10:00:22 TP0] Capture target decode CUDA graph end. elapsed=9.13 s, mem usage=0.58 GB, avail mem=11.53 GB.
<capacity>
[2026-11-30 10:00:24] INFO:     Started server process [4182]
[2026-11-30 10:00:24] INFO:     Waiting for application startup.
[2026-11-30 10:00:24] INFO:     Application startup complete.
[2026-11-30 10:00:24] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)
[2026-11-30 10:00:25] INFO:     127.0.0.1:51234 - "GET /model_info HTTP/1.1" 200 OK
[2026-11-30 10:00:25 TP0] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0
[2026-11-30 10:00:26] INFO:     127.0.0.1:51240 - "POST /generate HTTP/1.1" 200 OK
[2026-11-30 10:00:26] The server is fired up and ready to roll!
""").splitlines()

BAD_FLAG = """\
usage: sglang serve [-h] --model-path MODEL_PATH [--tokenizer-path TOKENIZER_PATH] [--host HOST] [--port PORT]
                    [--speculative-algorithm SPECULATIVE_ALGORITHM] ...
sglang serve: error: unrecognized arguments: --foo
sglang-coder.service: Main process exited, code=exited, status=2/INVALIDARGUMENT
sglang-coder.service: Failed with result 'exit-code'.
""".splitlines()

AMBIGUOUS = """\
sglang serve: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill
sglang-coder.service: Main process exited, code=exited, status=2/INVALIDARGUMENT
""".splitlines()

SCHEDULER_CRASH = """\
[2026-11-30 10:00:06 TP0] Load weight begin. avail mem=93.12 GB
[2026-11-30 10:00:11 TP0] Load weight end. elapsed=4.71 s, type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=77.80 GB, mem usage=15.32 GB.
[2026-11-30 10:00:14 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "%(site)s/sglang/srt/managers/scheduler.py", line 3010, in run_scheduler_process
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)
  File "%(site)s/sglang/srt/managers/scheduler.py", line 412, in __init__
    self.init_model_worker()
  File "%(site)s/sglang/srt/speculative/dflash_worker.py", line 188, in __init__
    self.draft_model_runner.capture_cuda_graphs()
RuntimeError: DDTree verify: tree mask has 64 columns, the draft block has 16

[2026-11-30 10:00:14] Received sigquit from a child process. It usually means the child failed.
sglang-coder.service: Main process exited, code=killed, status=9/KILL
sglang-coder.service: Failed with result 'signal'.
""".replace("%(site)s", SITE).splitlines()

OOM_KILL = """\
[2026-11-30 10:00:06 TP0] Load weight begin. avail mem=93.12 GB
sglang-coder.service: A process of this unit has been killed by the OOM killer.
sglang-coder.service: Main process exited, code=killed, status=9/KILL
sglang-coder.service: Failed with result 'oom-kill'.
""".splitlines()

KERNEL_OOM = splice("""\
Nov 30 10:00:09.101234 ct200 kernel: python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0
<oom_kill>
<memcg>
Nov 30 10:00:09.102000 ct200 kernel: Out of memory: Killed process 777 (postgres) total-vm:1034112kB, anon-rss:20000kB
""").splitlines()

UNKNOWN_ALGORITHM = """\
[2026-11-30 10:00:01] server_args=ServerArgs(model_path='/models/Qwen3-8B', speculative_algorithm='DDTREE', ...)
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "%(site)s/sglang/launch_server.py", line 32, in <module>
    server_args = prepare_server_args(sys.argv[1:])
  File "%(site)s/sglang/srt/speculative/spec_info.py", line 65, in from_string
    raise ValueError(f"Unknown speculative algorithm name: {name}")
ValueError: Unknown speculative algorithm name: DDTREE
sglang-coder.service: Main process exited, code=exited, status=1/FAILURE
sglang-coder.service: Failed with result 'exit-code'.
""".replace("%(site)s", SITE).splitlines()

PLUGIN_FAILURE = """\
[2026-11-30 10:00:02] Failed to load plugin ddtree from group sglang.srt.plugins
Traceback (most recent call last):
  File "%(site)s/sglang/srt/plugins/__init__.py", line 81, in load_plugins
    func = ep.load()
  File "/usr/lib/python3.11/importlib/metadata/__init__.py", line 202, in load
    module = import_module(match.group('module'))
ModuleNotFoundError: No module named 'sglang_overlay.adapter'
Traceback (most recent call last):
  File "%(site)s/sglang/srt/speculative/spec_info.py", line 65, in from_string
    raise ValueError(f"Unknown speculative algorithm name: {name}")
ValueError: Unknown speculative algorithm name: DDTREE
sglang-coder.service: Main process exited, code=exited, status=1/FAILURE
""".replace("%(site)s", SITE).splitlines()

HANG = GOOD_START + [
    "[2026-11-30 10:01:22] Health check failed. Server couldn't get a response from detokenizer for last 20 seconds. "
    "tic start time: 10:01:02. last_heartbeat time: 10:00:26",
]


def props(**overrides):
    """`systemctl show` properties of sglang-coder.service, running unless overridden."""
    base = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "Result": "success",
            "NRestarts": "0", "ExecMainStatus": "0", "ExecMainCode": "0", "ExecMainPID": "4182", "MainPID": "4182",
            "ActiveEnterTimestampMonotonic": "123456789", "InactiveExitTimestamp": "Mon 2026-11-30 10:00:00 UTC"}
    base.update(overrides)
    return base


FAILED_EXIT_2 = props(ActiveState="failed", SubState="failed", Result="exit-code", ExecMainCode="1", ExecMainStatus="2", MainPID="0")
FAILED_EXIT_1 = props(ActiveState="failed", SubState="failed", Result="exit-code", ExecMainCode="1", ExecMainStatus="1", MainPID="0")
FAILED_KILL = props(ActiveState="failed", SubState="failed", Result="signal", ExecMainCode="2", ExecMainStatus="9", MainPID="0")
FAILED_OOM = props(ActiveState="failed", SubState="failed", Result="oom-kill", ExecMainCode="2", ExecMainStatus="9", MainPID="0")
AUTO_RESTART = props(ActiveState="activating", SubState="auto-restart", Result="signal", ExecMainCode="2",
                     ExecMainStatus="9", MainPID="0", NRestarts="0")


# ---- journal and systemctl parsing ------------------------------------------------------------------

def test_split_journal_output_takes_the_cursor_and_drops_notices():
    out = "-- No entries --\nline one\n  indented\n-- cursor: s=8a1;i=2f;b=77;m=1c;t=5f;x=9\n"
    assert split_journal_output(out) == (["line one", "  indented"], "s=8a1;i=2f;b=77;m=1c;t=5f;x=9")
    assert split_journal_output("") == ([], None)


def test_parse_systemctl_show():
    text = "ActiveState=failed\nSubState=failed\nResult=oom-kill\nNRestarts=0\nInactiveExitTimestamp=Mon 2026-11-30 10:00:00 UTC\n"
    parsed = parse_systemctl_show(text)
    assert parsed["Result"] == "oom-kill" and parsed["InactiveExitTimestamp"] == "Mon 2026-11-30 10:00:00 UTC"


# ---- signatures ----------------------------------------------------------------------------------

def test_good_start_has_no_fatal_signature_and_every_progress_marker():
    assert match_signatures(GOOD_START) == []
    markers = [health.match_progress(line) for line in GOOD_START]
    assert [m for m in markers if m] == ["load_weight_begin", "load_weight_end", "load_weight_begin", "load_weight_end",
                                         "memory_pool_end", "cuda_graph_begin", "cuda_graph_end", "uvicorn_running", "fired_up"]


@pytest.mark.parametrize("lines, kinds", [
    (BAD_FLAG, ["bad_flag"]),
    (AMBIGUOUS, ["bad_flag"]),
    (SCHEDULER_CRASH, ["scheduler_exception", "self_kill"]),
    (UNKNOWN_ALGORITHM, ["traceback", "unknown_algorithm", "unknown_algorithm"]),  # the source line and the error
    (PLUGIN_FAILURE, ["plugin", "traceback", "traceback", "unknown_algorithm", "unknown_algorithm"]),
    (OOM_KILL, []),
    (["ImportError: %s/sgl_kernel/common_ops.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEi" % SITE], ["abi"]),
    (["RuntimeError: Could not load any common_ops library from %s/sgl_kernel" % SITE], ["abi"]),
    (["RuntimeError: Could not load libtorchcodec. Likely causes: FFmpeg is not properly installed"], ["torchcodec"]),
    (["torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device"], ["arch"]),
    (["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 94.97 GiB"], ["cuda_oom"]),
    (["[2026-11-30 11:00:00] SIGQUIT received. signum=None, frame=None. It usually means one child failed."], ["self_kill"]),
])
def test_signatures_on_real_lines(lines, kinds):
    assert [m["kind"] for m in match_signatures(lines)] == kinds


def test_extra_signatures_and_start_index():
    lines = ["all good", "NCCL WARN Cuda failure 'out of memory'", "Traceback (most recent call last):"]
    found = match_signatures(lines, extra=["NCCL WARN"], start=1)
    assert [(m["index"], m["kind"]) for m in found] == [(1, "custom"), (2, "traceback")]


def test_exception_summary_names_the_error_not_the_traceback():
    assert exception_summary(SCHEDULER_CRASH) == "RuntimeError: DDTree verify: tree mask has 64 columns, the draft block has 16"
    assert exception_summary(UNKNOWN_ALGORITHM) == "ValueError: Unknown speculative algorithm name: DDTREE"
    assert exception_summary(GOOD_START) is None
    assert exception_summary(PLUGIN_FAILURE) == "ModuleNotFoundError: No module named 'sglang_overlay.adapter'"
    assert exception_summary(PLUGIN_FAILURE, start=7) == "ValueError: Unknown speculative algorithm name: DDTREE"


def test_signature_evidence_carries_the_traceback():
    evidence = health.signature_evidence(SCHEDULER_CRASH, match_signatures(SCHEDULER_CRASH))
    assert evidence[0]["kind"] == "scheduler_exception"
    assert any(line.startswith("RuntimeError: DDTree verify") for line in evidence[0]["context"])


# ---- unit states ---------------------------------------------------------------------------------

@pytest.mark.parametrize("properties, phase, kind, alive", [
    (props(), "running", None, True),
    (props(ActiveState="activating", SubState="start-pre"), "starting", None, True),
    (FAILED_EXIT_2, "failed", "bad_flag", False),
    (FAILED_EXIT_1, "failed", "exited", False),
    (FAILED_KILL, "failed", "killed", False),
    (FAILED_OOM, "failed", "oom", False),
    (AUTO_RESTART, "restarting", "restarted", False),
    (props(NRestarts="2"), "restarting", "restarted", False),
    (props(ActiveState="failed", SubState="failed", Result="start-limit-hit"), "failed", "crash_loop", False),
    (props(ActiveState="deactivating", SubState="final-sigterm", Result="signal", ExecMainCode="2", ExecMainStatus="9"),
     "stopping", "killed", False),
    (props(ActiveState="deactivating", SubState="stop-sigterm"), "stopping", "stopping", False),
    (props(ActiveState="inactive", SubState="dead", ExecMainCode="1", ExecMainStatus="0", MainPID="0"), "exited", "exited", False),
    (props(ActiveState="inactive", SubState="dead", ExecMainCode="0", MainPID="0"), "inactive", "inactive", False),
    (props(LoadState="not-found", ActiveState="inactive"), "missing", "unit_missing", False),
])
def test_classify_unit(properties, phase, kind, alive):
    verdict = classify_unit(properties)
    assert (verdict["phase"], verdict["kind"], verdict["alive"], verdict["fatal"]) == (phase, kind, alive, not alive)


def test_exit_texts_are_systemds():
    assert classify_unit(FAILED_KILL)["exit"]["text"] == "status=9/KILL"
    assert "status=2" in classify_unit(FAILED_EXIT_2)["reason"]
    assert classify_unit(AUTO_RESTART)["reason"] == (
        "it died and systemd is about to restart it (activating/auto-restart, NRestarts=0, last exit status=9/KILL)")
    assert "systemd restarted it (NRestarts=2" in classify_unit(props(NRestarts="2"))["reason"]


# ---- diagnosis -----------------------------------------------------------------------------------

def diagnose(lines, properties, kernel=()):
    unit = classify_unit(properties)
    return diagnose_failure(unit, match_signatures(lines), lines, kernel_oom_lines(kernel, UNIT, [properties["ExecMainPID"]]))


def test_diagnose_bad_flag_quotes_the_parser():
    found = diagnose(BAD_FLAG, FAILED_EXIT_2)
    assert found["kind"] == "bad_flag" and "unrecognized arguments: --foo" in found["reason"]
    assert diagnose([], FAILED_EXIT_2)["kind"] == "bad_flag"  # exit status 2 alone says it too


def test_diagnose_self_kill_is_not_an_oom():
    found = diagnose(SCHEDULER_CRASH, FAILED_KILL, kernel=KERNEL_OOM[3:])  # an OOM of another process
    assert found["kind"] == "scheduler_exception" and found["oom"] is False
    assert "RuntimeError: DDTree verify" in found["reason"]
    assert "status=9/KILL after 'Received sigquit' is SGLang killing its own process tree, not an OOM" in found["reason"]


def test_diagnose_oom_from_result_and_from_the_kernel_log():
    assert diagnose(OOM_KILL, FAILED_OOM)["kind"] == "oom"
    found = diagnose(["[2026-11-30 10:00:06 TP0] Load weight begin. avail mem=93.12 GB"], FAILED_KILL, kernel=KERNEL_OOM)
    assert found["kind"] == "oom" and "oom-kill:constraint=CONSTRAINT_MEMCG" in found["reason"]


def test_kernel_oom_lines_keep_only_this_unit():
    lines = kernel_oom_lines(KERNEL_OOM, UNIT, ["4182"])
    assert len(lines) == 2 and all("4182" in line for line in lines)
    assert kernel_oom_lines(KERNEL_OOM, "sglang-other.service", ["9999"]) == []


def test_diagnose_sigkill_from_outside():
    found = diagnose(["[2026-11-30 10:00:06 TP0] Load weight begin. avail mem=93.12 GB"], FAILED_KILL)
    assert found["kind"] == "killed" and "no 'Received sigquit'" in found["reason"]


def test_diagnose_plugin_failure_is_the_cause_of_the_unknown_algorithm():
    found = diagnose(PLUGIN_FAILURE, FAILED_EXIT_1)
    assert found["kind"] == "plugin"
    assert "ModuleNotFoundError: No module named 'sglang_overlay.adapter'" in found["reason"]
    assert diagnose(UNKNOWN_ALGORITHM, FAILED_EXIT_1)["kind"] == "unknown_algorithm"


def test_diagnose_auto_restart_without_journal_evidence():
    found = diagnose([], AUTO_RESTART)
    assert found["kind"] == "restarted" and "systemd is about to restart it" in found["reason"]


# ---- the start watch (no sleeping: times are fed) ---------------------------------------------------

def feed_all(watch, timeline):
    """timeline: [(t, props, lines, port_open)] -> the last state."""
    state = None
    for moment, properties, lines, port in timeline:
        state = watch.feed(moment, properties, lines, port)
        if state["state"] in ("failed", "ready"):
            break
    return state


def test_watch_good_start_is_ready_when_the_port_answers():
    watch = StartWatch(started_at=100.0, no_progress_timeout=120, start_timeout=900, settle_seconds=2)
    state = feed_all(watch, [
        (100.0, props(ActiveState="activating", SubState="start-pre"), [], False),
        (102.0, props(), GOOD_START[:5], False),  # weights begin loading
        (200.0, props(), GOOD_START[5:12], False),  # 98 s later: weights loaded (deadline reset at 102)
        (300.0, props(), GOOD_START[12:20], False),  # graphs captured (reset at 200), uvicorn up
        (301.0, props(), GOOD_START[20:], True),
    ])
    assert state == {"state": "ready"}
    assert watch.first_progress_at == 102.0 and watch.port_at == 301.0
    assert watch.progress[-1]["marker"] == "fired_up"


def test_watch_no_progress_deadline():
    watch = StartWatch(started_at=0.0, no_progress_timeout=120, start_timeout=900)
    assert watch.feed(0.0, props(), GOOD_START[:5])["state"] == "starting"  # Load weight begin at 0
    assert watch.feed(119.0, props(), ["Loading safetensors checkpoint shards:  40% Completed | 2/5"])["state"] == "starting"
    state = watch.feed(120.5, props(), [])
    assert state["state"] == "failed" and state["kind"] == "no_progress"
    assert "'load_weight_begin'" in state["reason"] and "active/running" in state["reason"]


def test_watch_start_timeout_caps_steady_progress():
    watch = StartWatch(started_at=0.0, no_progress_timeout=120, start_timeout=300)
    moment = 0.0
    state = None
    while moment <= 400:
        state = watch.feed(moment, props(), ["[..] Load weight begin. avail mem=93.12 GB"])
        if state["state"] == "failed":
            break
        moment += 100
    assert state["kind"] == "start_timeout" and moment == 300


def test_watch_fails_on_a_signature_after_the_settle_poll_with_the_whole_traceback():
    watch = StartWatch(started_at=0.0, no_progress_timeout=120, start_timeout=900, settle_seconds=2)
    assert watch.feed(1.0, props(), SCHEDULER_CRASH[:3])["state"] == "failing"  # "Scheduler hit an exception"
    assert watch.feed(2.0, props(), SCHEDULER_CRASH[3:8])["state"] == "failing"
    state = watch.feed(3.0, FAILED_KILL, SCHEDULER_CRASH[8:])
    assert state["state"] == "failed" and state["kind"] == "scheduler_exception"
    assert "RuntimeError: DDTree verify" in state["reason"] and "not an OOM" in state["reason"]
    assert watch.feed(4.0, props(), [])["state"] == "failed"  # sticky


def test_watch_bad_flag_fails_at_once_without_settle():
    watch = StartWatch(started_at=0.0, no_progress_timeout=120, start_timeout=900, settle_seconds=0)
    state = watch.feed(0.5, FAILED_EXIT_2, BAD_FLAG)
    assert state["state"] == "failed" and state["kind"] == "bad_flag"


def test_watch_oom_refined_by_the_kernel_log():
    watch = StartWatch(started_at=0.0, no_progress_timeout=120, start_timeout=900)
    state = watch.feed(5.0, FAILED_KILL, ["[2026-11-30 10:00:06 TP0] Load weight begin. avail mem=93.12 GB"])
    assert state["kind"] == "killed" and health.wants_kernel_log(watch.unit)
    assert watch.refine(kernel_oom_lines(KERNEL_OOM, UNIT, ["4182"]))["kind"] == "oom"


def test_watch_port_open_with_a_fatal_line_is_not_ready():
    watch = StartWatch(started_at=0.0, no_progress_timeout=120, start_timeout=900, settle_seconds=1)
    assert watch.feed(0.0, props(), GOOD_START + ["Traceback (most recent call last):"], True)["state"] == "failing"


def test_watch_after_ready_still_catches_crashes():
    watch = StartWatch(started_at=0.0, no_progress_timeout=1, start_timeout=2)
    assert watch.feed(0.5, props(), GOOD_START, True)["state"] == "ready"
    assert watch.feed(50.0, props(), [])["state"] == "ready"  # no deadlines after ready
    state = watch.feed(51.0, AUTO_RESTART, SCHEDULER_CRASH[2:])
    assert state["state"] == "failed" and state["kind"] == "scheduler_exception"


def test_watch_excerpt_is_the_tail():
    watch = StartWatch(started_at=0.0, no_progress_timeout=120, start_timeout=900)
    watch.feed(0.0, props(), ["line %d" % i for i in range(200)])
    assert watch.excerpt(tail=3) == ["line 197", "line 198", "line 199"]


# ---- degenerate outputs --------------------------------------------------------------------------

@pytest.mark.parametrize("text, rule", [
    ("", "empty"),
    ("  \n\t ", "empty"),
    ("!!!!!!!!", "one_char"),  # the incident
    ("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!", "one_char"),
    ("!!!! !!!!\n!!!!", "one_char"),
    ("1, 1, 1, 1, 1, 1, 1, 1, 1, 1", "few_distinct"),
    ("the the the the the the the the", "few_distinct"),
    ("I think I think I think I think I think", "loop"),
    ("Paris is the capital of France. France France France France France France France", "loop"),
    ("<unk><unk><unk><unk><unk><unk>", "loop"),
    ("巴黎的首都巴黎的首都巴黎的首都巴黎的首都", "loop"),
    ("def f():\n    return f()\n    return f()\n    return f()\n    return f()\n    return f()", "loop"),
])
def test_degenerate_outputs_are_rejected(text, rule):
    verdict = degenerate_output(text)
    assert verdict["degenerate"] is True and verdict["rule"] == rule, verdict


@pytest.mark.parametrize("text", [
    "The capital of France is Paris, and the Seine runs through it.",
    "2, 3, 5, 7, 11, 13, 17, 19, 23, 29",
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
    "Das Wetter ist heute schön.\n今日はいい天気ですね。",
    "巴黎是法国的首都，塞纳河流经这座城市。",
    "Столица Франции — Париж; через него протекает Сена.",
    "| n | fib(n) |\n|---|--------|\n| 0 | 0 |\n| 1 | 1 |\n| 2 | 1 |",
    "Sure! Here is the answer:\n\n```python\nprint('hello')\n```",
    "42",
    "...",
    "Hmm...",
    "1000",
    "<think>\nThe user asks about France. Paris is the capital; the Seine flows through it.\n</think>\nParis, on the Seine.",
])
def test_good_outputs_pass(text):
    verdict = degenerate_output(text)
    assert verdict["degenerate"] is False, verdict


def test_periodic_suffix():
    assert health.periodic_suffix("xxabab", 2) == 4
    assert health.periodic_suffix("abc", 1) == 1
    assert health.periodic_suffix("", 1) == 0


# ---- baselines -----------------------------------------------------------------------------------

def test_compare_output_exact_and_tolerant():
    expected = "2, 3, 5, 7, 11, 13, 17, 19, 23, 29"
    assert compare_output(expected, expected)["match"] is True
    differs = compare_output(expected, "2, 3, 5, 7, 11, 13, 17, 19, 23, 31")
    assert differs["match"] is False and differs["common_prefix"] == 32 and differs["differing_chars"] == 2
    assert "29" in differs["expected_excerpt"] and "31" in differs["actual_excerpt"]
    assert compare_output(expected, "2, 3, 5, 7, 11, 13, 17, 19, 23, 31", tolerance=0.1)["match"] is True
    assert compare_output(expected, "!!!!!!!!", tolerance=0.1)["match"] is False
    assert compare_output(expected, expected + " and 31")["match"] is False  # longer counts too


def test_baseline_document_is_keyed_by_model_max_tokens_and_prompt():
    document = baseline_add(None, "coder", "p1", 64, {"text": "a"})
    document = baseline_add(document, "coder", "p2", 64, {"text": "b"})
    document = baseline_add(document, "coder", "p1", 32, {"text": "c"})
    assert document["format"] == 1
    assert baseline_lookup(document, "coder", "p1", 64) == {"text": "a"}
    assert baseline_lookup(document, "coder", "p1", 32) == {"text": "c"}
    assert baseline_lookup(document, "other", "p1", 64) is None
    assert baseline_lookup(None, "coder", "p1", 64) is None


# ---- performance ---------------------------------------------------------------------------------

def test_tokens_per_second():
    assert tokens_per_second([{"completion_tokens": 64, "seconds": 0.5}, {"completion_tokens": 36, "seconds": 0.5}]) == 100.0
    assert tokens_per_second([]) is None


def test_compare_metrics_floors_and_regression():
    assert compare_metrics({"tokens_per_second": 180.0, "accept_length": 3.4}, {"accept_length": 2.0},
                           {"tokens_per_second": 175.0, "accept_length": 3.38}) == []
    problems = compare_metrics({"tokens_per_second": 60.0, "accept_length": 1.0},
                               {"tokens_per_second": 100.0, "accept_length": 2.0},
                               {"tokens_per_second": 175.0, "accept_length": 3.4}, max_regression=0.5)
    assert problems == [
        "tokens/s 60 is below the floor 100",
        "tokens/s 60 is 66% below the previous release's 175 (max_regression 0.5 allows down to 87.5)",
        "acceptance length 1 is below the floor 2",
        "acceptance length 1 is 71% below the previous release's 3.4 (max_regression 0.5 allows down to 1.7)",
    ]
    assert compare_metrics({"tokens_per_second": 90.0}, None, {"tokens_per_second": "200.0"}, 0.5)[0].startswith(
        "tokens/s 90 is 55% below the previous release's 200")  # numbers from Jinja may be strings
    assert compare_metrics({"tokens_per_second": 90.0, "accept_length": None}, {"accept_length": 2.0}) == [
        "no acceptance length was measured, but the floor is 2 (is speculative decoding on?)"]


def test_metrics_document_keeps_the_last_records_per_model():
    document = None
    for index in range(5):
        document = metrics_add(document, {"model": "coder" if index % 2 == 0 else "chat", "tokens_per_second": index}, keep=4)
    assert len(document["records"]) == 4
    assert previous_metrics(document, "coder")["tokens_per_second"] == 4
    assert previous_metrics(document, "chat")["tokens_per_second"] == 3
    assert previous_metrics(None, "coder") is None


def test_redact():
    assert redact("401: bad key sk-secret-123", "sk-secret-123") == "401: bad key ********"
    assert redact(None, "x") is None and redact("text", None) == "text"
