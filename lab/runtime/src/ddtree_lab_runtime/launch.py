"""The lab runtime's launcher: the order of events of ``python -m sglang.launch_server``.

1. ``load_plugins()``; 2. ``prepare_server_args(argv)`` (SGLang's parser: bad flags exit 2);
3. the speculative resolution (``resolve.py``; an unknown algorithm raises SGLang's ValueError:
traceback, exit 1); 4. "Load weight begin" ... "Load weight end" (simulated load time) for the
target and the draft; 5. the scheduler thread; 6. uvicorn ("Uvicorn running on http://HOST:PORT");
7. the warm-up request (``/model_info``, then ``/generate`` as SGLang's warm-up does), then "The
server is fired up and ready to roll!". SIGTERM: uvicorn stops accepting, in-flight requests
finish (up to LAB_RUNTIME_DRAIN_SECONDS), exit 0. Fatal errors: SGLang's SIGQUIT path, SIGKILL.
With ``--nnodes N`` (N > 1) the ranks form their group before loading (ranks.py); only rank 0 goes on to
serve HTTP, the other ranks load their part and wait (SGLang 0.5.23: non-zero ranks run no HTTP server).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from typing import Optional, Sequence

logger = logging.getLogger("ddtree_lab_runtime")


def _avail_mem_gb() -> float:
    try:
        import psutil

        return psutil.virtual_memory().available / 2**30
    except Exception:  # pragma: no cover
        return 0.0


def _sigquit_handler(signum, frame) -> None:
    """SGLang's launch-phase SIGQUIT handler: a child failed -> kill the whole tree, itself included."""
    logger.error("Received sigquit from a child process. It usually means the child failed.")
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _server_args_for_logging(server_args) -> dict:
    """SGLang 0.5.23's start-up line (``engine._server_args_for_logging``): every resolved field, only the
    watermark keys redacted. The API key is in clear, as on a real server, so the lab shows whether the
    collection keeps it out of the journal (docs/services.md, "The API key")."""
    from sglang.srt.sampling.watermarking.core import redact_watermark_secrets

    return redact_watermark_secrets(server_args.resolved_dict())


def _crash_at_start(message: str) -> None:
    from .scheduler import fatal

    try:
        raise RuntimeError(message)
    except RuntimeError:
        fatal(f"Scheduler hit an exception: {traceback.format_exc()}")


def _join_group(server_args, lab_env):
    """Form the group of a server across nodes (None for one node): fatal when it cannot form; a peer that
    dies later is fatal too, a peer that leaves on purpose ends this rank cleanly (ranks.py)."""
    nnodes = int(getattr(server_args, "nnodes", 1) or 1)
    if nnodes <= 1:
        return None
    from .ranks import RankError, RankGroup
    from .scheduler import fatal

    def peer_left(message: str) -> None:
        logger.info("%s: this rank shuts down too", message)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(0)

    def peer_lost(message: str) -> None:
        try:
            raise RuntimeError(f"the group lost a rank: {message}")
        except RuntimeError:
            fatal(f"Scheduler hit an exception: {traceback.format_exc()}")

    group = RankGroup(
        nnodes,
        int(getattr(server_args, "node_rank", 0) or 0),
        str(getattr(server_args, "dist_init_addr", "") or ""),
        join_seconds=lab_env.join_seconds,
        on_peer_lost=peer_lost,
        on_peer_left=peer_left,
    )
    try:
        group.join()
    except RankError as err:
        _crash_at_start(f"torch.distributed rendezvous failed (lab): {err}")
    faults = lab_env.faults
    if faults.crash_rank == group.rank:
        threading.Timer(
            faults.crash_rank_seconds, _crash_at_start, args=(f"lab fault crash_rank: rank {group.rank} failed",)
        ).start()
    return group


def _serve_as_worker(group, load) -> None:
    """A rank other than 0: load its part, then wait; SIGTERM says goodbye to the group and exits 0."""
    load()
    logger.info("Rank %d is ready: rank 0 serves HTTP, this rank serves none", group.rank)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    group.close()
    logger.info("lab runtime: rank %d stopped", group.rank)


def _load(what: str, path: str, seconds: float, build):
    before = _avail_mem_gb()
    logger.info("Load weight begin. avail mem=%.2f GB", before)
    time.sleep(seconds)
    obj = build()
    after = _avail_mem_gb()
    logger.info(
        "Load weight end. type=%s, dtype=torch.float64, avail mem=%.2f GB, mem usage=%.2f GB.",
        what,
        after,
        max(before - after, 0.0),
    )
    return obj


def _warmup(state, host: str, port: int, skip: bool, on_ready) -> None:
    """SGLang's ``_wait_and_warmup``: wait for the port, warm up through /generate, announce."""
    connect = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    if ":" in connect and not connect.startswith("["):
        connect = f"[{connect}]"
    base = f"http://{connect}:{port}"
    headers = {"Content-Type": "application/json"}
    if state.api_key:
        headers["Authorization"] = f"Bearer {state.api_key}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(urllib.request.Request(base + "/model_info", headers=headers), timeout=5):
                    break
            except (urllib.error.URLError, OSError):
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        if not skip:
            payload = json.dumps(
                {"text": "The capital city of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
            ).encode()
            timeout = float(os.environ.get("SGLANG_WARMUP_TIMEOUT", "600"))
            with urllib.request.urlopen(
                urllib.request.Request(base + "/generate", data=payload, headers=headers, method="POST"),
                timeout=timeout,
            ) as response:
                json.loads(response.read())
    except Exception:
        logger.error("Initialization failed. warmup error: %s", traceback.format_exc())
        _sigquit_handler(signal.SIGQUIT, None)
        return
    on_ready()


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    # journald reads a pipe: without this, stdout (uvicorn's access log) would be block-buffered.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    import torch

    torch.set_num_threads(max(1, int(os.environ.get("LAB_RUNTIME_TORCH_THREADS", "1"))))

    from sglang.srt.plugins import load_plugins

    load_plugins()

    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.server_args import prepare_server_args

    from .faults import LabEnv

    if LabEnv.from_environ().faults.bad_flag:
        argv = argv + ["--lab-fault-unknown-flag"]
    server_args = prepare_server_args(argv)  # SGLang's parser: exit 2 on bad flags

    from .decoding import Decoder
    from .model import LabDraftConfig, LabLM, LabModelConfig
    from .resolve import resolve_server_args
    from .tokenizer import ByteTokenizer

    lab_env = LabEnv.from_environ()
    plan = resolve_server_args(server_args)  # unknown algorithm -> ValueError (traceback, exit 1)
    cfg = resolving_view(server_args)
    faults = lab_env.faults
    logger.info("server_args=%s", _server_args_for_logging(server_args))
    logger.info(
        "lab runtime (ddtree_lab_runtime, not SGLang's scheduler): decoder=%s algorithm=%s "
        "budget=%s top_k=%s draft_len=%s faults=%s%s",
        plan.mode,
        plan.algorithm,
        plan.budget,
        plan.top_k,
        plan.draft_len,
        faults.describe(),
        f" ({plan.note})" if plan.note else "",
    )
    signal.signal(signal.SIGQUIT, _sigquit_handler)

    if faults.crash_at_start is not None:
        logger.info("Load weight begin. avail mem=%.2f GB", _avail_mem_gb())
        time.sleep(min(lab_env.load_seconds, 0.5))
        _crash_at_start(faults.crash_at_start)
    group = _join_group(server_args, lab_env)

    share = 0.5 if plan.speculative else 1.0
    model_config = LabModelConfig.from_path(cfg.model_path, context_length=cfg.context_length)

    def load_models():
        target = _load("LabNgramForCausalLM", cfg.model_path, lab_env.load_seconds * share, lambda: LabLM(model_config))
        draft_config = None
        if plan.speculative:
            draft_path = plan.draft_path or cfg.model_path
            draft_config = _load(
                "LabDrafter",
                draft_path,
                lab_env.load_seconds * (1 - share),
                lambda: LabDraftConfig.from_path(draft_path),
            )
        return target, draft_config

    if group is not None and group.rank > 0:
        _serve_as_worker(group, load_models)
        return
    target, draft_config = load_models()
    tokenizer = ByteTokenizer()
    degenerate_token = tokenizer.encode(faults.degenerate)[0] if faults.degenerate is not None else None
    decoder = Decoder(
        target,
        plan,
        draft_config,
        degenerate_token=degenerate_token,
        per_token_delay=faults.slow_ms / 1000.0,
        accept_collapse=faults.accept_collapse,
    )

    from .endpoints import ServerState, build_app
    from .scheduler import Scheduler

    scheduler = Scheduler(decoder, tokenizer, faults, decode_log_interval=cfg.decode_log_interval)
    scheduler.start()
    context_len = model_config.context_length
    logger.info(
        "max_total_num_tokens=%d, chunked_prefill_size=%s, max_prefill_tokens=%s, max_running_requests=%s, "
        "context_len=%d, available_gpu_mem=%.2f GB",
        context_len * 4,
        cfg.chunked_prefill_size,
        cfg.max_prefill_tokens,
        cfg.max_running_requests,
        context_len,
        _avail_mem_gb(),
    )
    if plan.mode == "ddtree":
        logger.info(
            "DDTREE worker ready (lab): budget=%d, top_k=%d, draft positions=%d, tree builder=%s",
            plan.budget,
            plan.top_k,
            plan.draft_len,
            decoder.builder_name,
        )
    state = ServerState(
        server_args=server_args,
        plan=plan,
        tokenizer=tokenizer,
        scheduler=scheduler,
        model_path=cfg.model_path,
        served_model_name=cfg.served_model_name or cfg.model_path,
        context_len=context_len,
        model_type=target.model_type,
        architectures=target.architectures,
        health_timeout=lab_env.health_timeout,
        api_key=cfg.api_key,
        admin_api_key=cfg.admin_api_key,
        enable_metrics=bool(cfg.enable_metrics),
        lab_info={
            "model_seed": model_config.seed,
            "model_config_source": model_config.source,
            "tree_builder": decoder.builder_name,
            "faults": faults.describe(),
            "lab_nvidia_gpus": os.environ.get("LAB_NVIDIA_GPUS"),
        },
    )
    app = build_app(state)

    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:  # SIGTERM / SIGINT
            if not state.gracefully_exit:
                state.gracefully_exit = True
                if group is not None:
                    group.close()
                logger.info(
                    "Gracefully exiting... Remaining number of requests %d.",
                    scheduler.running + scheduler.queue_size(),
                )
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app,
        host=cfg.host,
        port=int(cfg.port),
        log_level=(cfg.log_level_http or cfg.log_level or "info").lower(),
        timeout_keep_alive=5,
        timeout_graceful_shutdown=max(lab_env.drain_seconds, 0.1) or None,
        lifespan="off",
        ws="none",
    )
    server = _Server(config)

    def on_ready() -> None:
        state.status = "Up"
        scheduler.armed = True
        logger.info("The server is fired up and ready to roll!")

    threading.Thread(
        target=_warmup,
        args=(state, cfg.host, int(cfg.port), bool(cfg.skip_server_warmup), on_ready),
        name="lab-warmup",
        daemon=True,
    ).start()
    # uvicorn re-raises the signal that stopped it once the handlers are restored: make that a no-op,
    # so a SIGTERM ends in a clean exit 0 after the drain (as SGLang's launcher does).
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    server.run()
    if not server.started:
        sys.exit(1)  # e.g. the port is taken (uvicorn logged why); the other ranks see this rank gone
    scheduler.stop(timeout=2.0)
    logger.info("lab runtime: server stopped")
