"""Real-looking SGLang 0.5.23 journals, kernel logs and unit states, shared by the health gate's tests."""

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
    base = {
        "LoadState": "loaded",
        "ActiveState": "active",
        "SubState": "running",
        "Result": "success",
        "NRestarts": "0",
        "ExecMainStatus": "0",
        "ExecMainCode": "0",
        "ExecMainPID": "4182",
        "MainPID": "4182",
        "ActiveEnterTimestampMonotonic": "123456789",
        "InactiveExitTimestamp": "Mon 2026-11-30 10:00:00 UTC",
    }
    base.update(overrides)
    return base


FAILED_EXIT_2 = props(
    ActiveState="failed", SubState="failed", Result="exit-code", ExecMainCode="1", ExecMainStatus="2", MainPID="0"
)
FAILED_EXIT_1 = props(
    ActiveState="failed", SubState="failed", Result="exit-code", ExecMainCode="1", ExecMainStatus="1", MainPID="0"
)
FAILED_KILL = props(
    ActiveState="failed", SubState="failed", Result="signal", ExecMainCode="2", ExecMainStatus="9", MainPID="0"
)
FAILED_OOM = props(
    ActiveState="failed", SubState="failed", Result="oom-kill", ExecMainCode="2", ExecMainStatus="9", MainPID="0"
)
AUTO_RESTART = props(
    ActiveState="activating",
    SubState="auto-restart",
    Result="signal",
    ExecMainCode="2",
    ExecMainStatus="9",
    MainPID="0",
    NRestarts="0",
)
