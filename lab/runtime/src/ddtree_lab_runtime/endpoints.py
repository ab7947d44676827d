"""SGLang 0.5.23's HTTP surface as the deploy tooling uses it (Starlette, served by uvicorn).

Routes: ``/health`` and ``/health_generate`` (a 1-token generation through the scheduler; 503
while starting, shutting down, or when no token came back within SGLANG_HEALTH_CHECK_TIMEOUT),
``/ready``, ``/v1/models`` (from memory), ``/v1/models/{model}``, ``/model_info``,
``/server_info`` (+ the deprecated ``get_`` aliases), ``/generate`` (native), ``/v1/completions``,
``/v1/chat/completions`` (both with ``stream``), ``/metrics`` (with ``--enable-metrics``),
``/flush_cache`` and ``/freeze_gc`` (no-ops). API keys: SGLang's own ``decide_request_auth``
(health, ready and metrics are always open).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from .decoding import DecodePlan, SamplingParams
from .scheduler import GenRequest, Histogram, Scheduler
from .tokenizer import ByteTokenizer

logger = logging.getLogger("ddtree_lab_runtime")


@dataclass
class ServerState:
    server_args: Any
    plan: DecodePlan
    tokenizer: ByteTokenizer
    scheduler: Scheduler
    model_path: str
    served_model_name: str
    context_len: int
    model_type: str
    architectures: list
    health_timeout: float
    api_key: Optional[str] = None
    admin_api_key: Optional[str] = None
    enable_metrics: bool = False
    status: str = "Starting"  # Starting | Up | UnHealthy (SGLang's ServerStatus)
    gracefully_exit: bool = False
    startup_time: float = field(default_factory=time.time)
    lab_info: dict = field(default_factory=dict)


class BadRequest(Exception):
    """An error answer. err_type: SGLang 0.5.23's "type" ("BadRequestError" from its OpenAI layer's own
    checks, "Bad Request" from FastAPI's request validation: invalid JSON, a wrong Content-Type)."""

    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError"):
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type


def _error(message: str, status: int = 400, err_type: str = "BadRequestError") -> JSONResponse:
    return JSONResponse(
        {"object": "error", "message": message, "type": err_type, "param": None, "code": status},
        status_code=status,
    )


def build_app(state: ServerState) -> Starlette:
    tokenizer = state.tokenizer
    scheduler = state.scheduler

    # ---- generation plumbing ----

    async def run(prompt_ids: list, params: SamplingParams, kind: str = "user") -> AsyncIterator[dict]:
        loop = asyncio.get_running_loop()
        request = GenRequest(prompt_ids=prompt_ids, params=params, kind=kind, loop=loop, sink=asyncio.Queue())
        scheduler.submit(request)
        try:
            while True:
                event = await request.sink.get()
                yield event
                if event["type"] == "done":
                    return
        finally:
            request.cancelled = True  # no-op when finished; stops the scheduler when the client left

    async def complete(prompt_ids: list, params: SamplingParams) -> dict:
        async for event in run(prompt_ids, params):
            if event["type"] == "done":
                return event
        raise RuntimeError("generation ended without a result")

    def check_length(prompt_ids: list, params: SamplingParams) -> None:
        if not prompt_ids:
            raise BadRequest("The input is empty.")
        if params.max_new_tokens is None:
            params.max_new_tokens = max(state.context_len - len(prompt_ids), 0)
        total = len(prompt_ids) + params.max_new_tokens
        if len(prompt_ids) >= state.context_len or total > state.context_len:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of {state.context_len} "
                f"tokens. You requested a total of {total} tokens: {len(prompt_ids)} tokens from the input "
                f"messages and {params.max_new_tokens} tokens for the completion. Please reduce the number "
                "of tokens in the input messages or the completion to fit within the limit."
            )

    def sampling(raw: dict, *, max_key: str, default_max: Optional[int]) -> SamplingParams:
        try:
            max_new = raw.get(max_key, default_max)
            if max_key != "max_new_tokens" and raw.get("max_completion_tokens") is not None:
                max_new = raw["max_completion_tokens"]
            stop = raw.get("stop")
            stop = [stop] if isinstance(stop, str) else list(stop or [])
            seed = raw.get("seed", raw.get("sampling_seed"))
            params = SamplingParams(
                max_new_tokens=None if max_new is None else int(max_new),
                temperature=float(1.0 if raw.get("temperature") is None else raw["temperature"]),
                top_p=float(1.0 if raw.get("top_p") is None else raw["top_p"]),
                top_k=int(-1 if raw.get("top_k") is None else raw["top_k"]),
                min_p=float(raw.get("min_p") or 0.0),
                seed=None if seed is None else int(seed),
                stop=[s for s in stop if isinstance(s, str) and s],
                stop_token_ids=[int(t) for t in (raw.get("stop_token_ids") or [])],
                ignore_eos=bool(raw.get("ignore_eos", False)),
                skip_special_tokens=bool(raw.get("skip_special_tokens", True)),
            )
        except (TypeError, ValueError) as exc:
            raise BadRequest(f"invalid sampling parameters: {exc}") from None
        if params.max_new_tokens is not None and params.max_new_tokens < 0:
            raise BadRequest(f"max_new_tokens must be at least 0, got {params.max_new_tokens}.")
        if params.temperature < 0:
            raise BadRequest("temperature must be non-negative")
        if not 0.0 < params.top_p <= 1.0:
            raise BadRequest("top_p must be in (0, 1]")
        return params

    async def body(request: Request, json_only: bool = False) -> dict:
        """The request's JSON object, refused as SGLang's FastAPI layer refuses it (status, type, message
        form as SGLang 0.5.23 answers: tests/fixtures/sglang-conformance/)."""
        if json_only and request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            detail = (
                "{'loc': ['header', 'content-type'], 'msg': \"Unsupported Media Type: Only 'application/json' "
                "is allowed\", 'type': 'value_error'}"
            )
            raise BadRequest(f"1 validation error:\n  {detail} [{detail}]", err_type="Bad Request")
        raw = await request.body()
        try:
            data = json.loads(raw)
        except ValueError as exc:
            pos = getattr(exc, "pos", 0)
            detail = (
                f"{{'type': 'json_invalid', 'loc': ('body', {pos}), 'msg': 'JSON decode error', 'input': {{}}, "
                f"'ctx': {{'error': {str(getattr(exc, 'msg', exc))!r}}}}}"
            )
            raise BadRequest(
                f"1 validation error:\n  {detail}\n\n  {request.method} {request.url.path} [{detail}]",
                err_type="Bad Request",
            ) from None
        if not isinstance(data, dict):
            raise BadRequest("the request body must be a JSON object")
        return data

    def prompt_ids_of(prompt: Any) -> list:
        if isinstance(prompt, str):
            return tokenizer.encode(prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if isinstance(prompt, list) and len(prompt) == 1:
            return prompt_ids_of(prompt[0])
        raise BadRequest("prompt must be a string or a list of token ids (one prompt per request in the lab)")

    def sse(data: Any) -> bytes:
        return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()

    def handled(fn):
        async def wrapper(request: Request) -> Response:
            try:
                return await fn(request)
            except BadRequest as exc:
                return _error(exc.message, exc.status, exc.err_type)

        wrapper.__name__ = fn.__name__
        return wrapper

    # ---- health ----

    async def health(request: Request) -> Response:
        if state.gracefully_exit:
            logger.info("Health check request received during shutdown. Returning 503.")
            return Response(status_code=503)
        if state.status == "Starting":
            return Response(status_code=503)
        tic = time.time()
        loop = asyncio.get_running_loop()
        probe = GenRequest(
            prompt_ids=[0],
            params=SamplingParams(max_new_tokens=1, temperature=0.0),
            kind="health",
            loop=loop,
            sink=asyncio.Queue(),
            rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
        )
        scheduler.submit(probe)
        while time.time() < tic + state.health_timeout:
            await asyncio.sleep(1)
            if scheduler.last_receive > tic:
                probe.cancelled = True
                state.status = "Up"
                return Response(status_code=200)
        probe.cancelled = True
        logger.error(
            "Health check failed. Server couldn't get a response from detokenizer for last %s seconds. "
            "tic start time: %s. last_heartbeat time: %s",
            f"{state.health_timeout:g}",
            time.strftime("%H:%M:%S", time.localtime(tic)),
            time.strftime("%H:%M:%S", time.localtime(scheduler.last_receive)),
        )
        state.status = "UnHealthy"
        return Response(status_code=503)

    async def ready(request: Request) -> Response:
        return Response(status_code=200 if state.status != "Starting" and not state.gracefully_exit else 503)

    # ---- model / server info (answered from memory) ----

    def model_card(name: str) -> dict:
        return {
            "id": name,
            "object": "model",
            "created": int(state.startup_time),
            "owned_by": "sglang",
            "root": name,
            "parent": None,
            "max_model_len": state.context_len,
        }

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [model_card(state.served_model_name)]})

    async def model_detail(request: Request) -> Response:
        name = request.path_params["model"]
        if name != state.served_model_name:
            return JSONResponse(
                {
                    "error": {
                        "message": f"The model '{name}' does not exist",
                        "type": "invalid_request_error",
                        "param": "model",
                        "code": "model_not_found",
                    }
                },
                status_code=404,
            )
        return JSONResponse(model_card(name))

    async def model_info(request: Request) -> Response:
        return JSONResponse(
            {
                "model_path": state.model_path,
                "served_model_name": state.served_model_name,
                "tokenizer_path": state.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": "auto",
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": state.model_type,
                "architectures": state.architectures,
            }
        )

    async def server_info(request: Request) -> Response:
        from sglang.version import __version__  # noqa: PLC0415

        info = state.server_args.resolved_dict()
        info["launch_command"] = getattr(state.server_args, "launch_command", None)
        internal = {
            "last_gen_throughput": scheduler.gen_throughput(),
            "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": state.context_len},
            "lab_runtime": {
                **state.lab_info,
                **state.plan.to_dict(),
                "spec_verify_ct_total": scheduler.spec.forward_ct,
                "decode_batches": scheduler.spec_metrics.decode_batches,
                "decode_log_interval": scheduler.spec_metrics.decode_log_interval,
                "spec_accept_rate": scheduler.spec_accept_rate(),
            },
        }
        accept = scheduler.avg_spec_accept_length()
        if accept is not None:
            internal["avg_spec_accept_length"] = accept
        info.update(
            {
                "max_total_num_tokens": state.context_len * 4,
                "max_req_input_len": state.context_len - 1,
                "startup_time": state.startup_time,
                "internal_states": [internal],
                "version": __version__,
                "frontend": "python",
            }
        )
        return JSONResponse(json.loads(json.dumps(info, default=str)))

    # ---- metrics ----

    async def metrics(request: Request) -> Response:
        labels = {
            "model_name": state.served_model_name,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        tok_labels = {"model_name": state.served_model_name, "engine_type": "unified"}

        def fmt(lbl: dict, extra: Optional[dict] = None) -> str:
            items = {**lbl, **(extra or {})}
            return "{" + ",".join(f'{k}="{v}"' for k, v in items.items()) + "}"

        lines: list[str] = []

        def gauge(name: str, doc: str, value: float, lbl: dict = labels, kind: str = "gauge") -> None:
            lines.extend([f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name}{fmt(lbl)} {float(value)}"])

        def histogram(name: str, doc: str, hist: Histogram) -> None:
            lines.extend([f"# HELP {name} {doc}", f"# TYPE {name} histogram"])
            for bound, count in zip(hist.buckets, hist.counts):
                lines.append(f"{name}_bucket{fmt(tok_labels, {'le': bound})} {float(count)}")
            lines.append(f"{name}_bucket{fmt(tok_labels, {'le': '+Inf'})} {float(hist.total)}")
            lines.append(f"{name}_count{fmt(tok_labels)} {float(hist.total)}")
            lines.append(f"{name}_sum{fmt(tok_labels)} {hist.sum}")

        gauge("sglang:num_running_reqs", "The number of running requests.", scheduler.running)
        gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", scheduler.queue_size())
        gauge("sglang:gen_throughput", "The generation throughput (token/s).", scheduler.gen_throughput())
        gauge(
            "sglang:spec_accept_length",
            "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
            scheduler.accept_length(scheduler.spec_metrics.logged),
        )  # SGLang: the last logged window's
        gauge(
            "sglang:spec_accept_rate",
            "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).",
            scheduler.accept_rate(scheduler.spec_metrics.logged),
        )
        gauge(
            "sglang:prompt_tokens_total",
            "Number of prefill tokens processed.",
            scheduler.prompt_tokens_total,
            tok_labels,
            "counter",
        )
        gauge(
            "sglang:generation_tokens_total",
            "Number of generation tokens processed.",
            scheduler.generation_tokens_total,
            tok_labels,
            "counter",
        )
        gauge(
            "sglang:num_requests_total",
            "Number of requests processed.",
            scheduler.num_requests_total,
            tok_labels,
            "counter",
        )
        histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", scheduler.ttft)
        histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", scheduler.itl)
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4; charset=utf-8")

    # ---- native generation ----

    @handled
    async def generate(request: Request) -> Response:
        data = await body(request)
        if data.get("input_ids") is not None:
            prompt = data["input_ids"]
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
                raise BadRequest("batched input_ids are not supported by the lab runtime")
            prompt_ids = prompt_ids_of(prompt)
        elif isinstance(data.get("text"), str):
            prompt_ids = tokenizer.encode(data["text"])
        elif isinstance(data.get("text"), list):
            raise BadRequest("batched text is not supported by the lab runtime")
        else:
            raise BadRequest("Either text or input_ids should be provided.")
        params = sampling(data.get("sampling_params") or {}, max_key="max_new_tokens", default_max=128)
        check_length(prompt_ids, params)

        def result(event: dict, text: str) -> dict:
            return {"text": text, "output_ids": event["ids"], "meta_info": event["meta"]}

        if data.get("stream"):

            async def stream():
                text, ids = "", []
                async for event in run(prompt_ids, params):
                    if event["type"] == "delta":
                        text += event["text"]
                        ids += event["ids"]
                        meta = {
                            "id": "",
                            "finish_reason": None,
                            "prompt_tokens": len(prompt_ids),
                            "completion_tokens": len(ids),
                        }
                        yield sse({"text": text, "output_ids": list(ids), "meta_info": meta})
                    else:
                        yield sse(result(event, event["text"]))
                yield b"data: [DONE]\n\n"

            return StreamingResponse(stream(), media_type="text/event-stream")
        event = await complete(prompt_ids, params)
        return JSONResponse(result(event, event["text"]))

    # ---- OpenAI-compatible ----

    def finish_of(meta: dict) -> tuple[Optional[str], Any]:
        reason = meta.get("finish_reason") or {}
        kind = reason.get("type")
        return ({"stop": "stop", "length": "length", "abort": "abort"}.get(kind, kind), reason.get("matched"))

    def usage(metas: list, details: bool = True) -> dict:
        """SGLang's usage: the prompt once, the completions of all n choices. The streamed usage chunk
        of /v1/completions has no *_details keys (as recorded)."""
        prompt, completion = metas[0]["prompt_tokens"], sum(meta["completion_tokens"] for meta in metas)
        out = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "reasoning_tokens": 0,
        }
        if details:
            out.update(prompt_tokens_details=None, completion_tokens_details=None)
        return out

    def openai_request(data: dict, default_max: Optional[int]) -> tuple[SamplingParams, int, bool]:
        """-> (sampling parameters, n, include_usage). What the lab cannot do it refuses with SGLang's
        error shape (400, BadRequestError), naming the option: logprobs, n > 1 while streaming."""
        try:
            n = int(data.get("n") or 1)
        except (TypeError, ValueError):
            raise BadRequest(f"n must be an integer, got {data.get('n')!r}") from None
        if n < 1:
            raise BadRequest(f"n must be at least 1, got {n}.")
        if n > 1 and data.get("stream"):
            raise BadRequest("n > 1 with stream is not supported by the lab runtime")
        if data.get("logprobs") or data.get("top_logprobs"):
            raise BadRequest("logprobs are not supported by the lab runtime")
        options = data.get("stream_options") or {}
        include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        return sampling(data, max_key="max_tokens", default_max=default_max), n, include_usage

    async def complete_n(prompt_ids: list, params: SamplingParams, n: int) -> list:
        return list(await asyncio.gather(*(complete(prompt_ids, params) for _ in range(n))))

    def echoed_model(data: dict) -> str:
        """The model field of an answer: the request's (SGLang echoes it; "default" when absent)."""
        return data.get("model") or "default"

    async def held(events: AsyncIterator[dict]) -> AsyncIterator[tuple[str, Optional[dict]]]:
        """(text, None) per streamed piece, the last piece together with the done event: (text, done).
        SGLang sends the last text in the same chunk as finish_reason."""
        pending = None
        async for event in events:
            if event["type"] == "delta":
                if not event["text"]:
                    continue
                if pending is not None:
                    yield pending, None
                pending = event["text"]
            else:
                yield pending or "", event

    @handled
    async def completions(request: Request) -> Response:
        data = await body(request, json_only=True)
        if "prompt" not in data:
            raise BadRequest("prompt is required")
        if data["prompt"] in ("", []):
            raise BadRequest("Prompt cannot be empty")
        prompt_ids = prompt_ids_of(data["prompt"])
        params, n, include_usage = openai_request(data, default_max=16)
        check_length(prompt_ids, params)
        rid = uuid.uuid4().hex
        created = int(time.time())
        model = echoed_model(data)

        def chunk(choices: list, usage_value=None) -> bytes:
            return sse(
                {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "choices": choices,
                    "usage": usage_value,
                }
            )

        if data.get("stream"):

            async def stream():
                async for text, done in held(run(prompt_ids, params)):
                    reason, matched = finish_of(done["meta"]) if done else (None, None)
                    yield chunk(
                        [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "matched_stop": matched}]
                    )
                    if done and include_usage:
                        yield chunk([], usage([done["meta"]], details=False))
                yield b"data: [DONE]\n\n"

            return StreamingResponse(stream(), media_type="text/event-stream")
        events = await complete_n(prompt_ids, params, n)
        choices = []
        for index, event in enumerate(events):
            reason, matched = finish_of(event["meta"])
            choices.append(
                {
                    "index": index,
                    "text": event["text"],
                    "logprobs": None,
                    "finish_reason": reason,
                    "matched_stop": matched,
                }
            )
        return JSONResponse(
            {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": choices,
                "usage": usage([event["meta"] for event in events]),
                "metadata": {"weight_version": "default"},
            }
        )

    @handled
    async def chat_completions(request: Request) -> Response:
        data = await body(request, json_only=True)
        messages = data.get("messages")
        if not isinstance(messages, list):
            raise BadRequest("messages must be a list")
        if not messages:
            raise BadRequest("Messages cannot be empty.")
        prompt_ids = tokenizer.encode(tokenizer.apply_chat_template(messages))
        params, n, include_usage = openai_request(data, default_max=None)
        check_length(prompt_ids, params)
        rid = uuid.uuid4().hex
        created = int(time.time())
        model = echoed_model(data)

        def chunk(choices: list, **extra) -> bytes:
            return sse(
                {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": choices,
                    **extra,
                }
            )

        if data.get("stream"):

            async def stream():
                # SGLang: a role-only chunk first, the text, a finish chunk without text, then the usage
                # as a chunk of its own (choices []) only when stream_options.include_usage is set.
                yield chunk(
                    [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": "", "reasoning_content": None},
                            "logprobs": None,
                            "finish_reason": None,
                            "matched_stop": None,
                        }
                    ]
                )
                async for event in run(prompt_ids, params):
                    if event["type"] == "delta":
                        if event["text"]:
                            yield chunk(
                                [
                                    {
                                        "index": 0,
                                        "delta": {"content": event["text"], "reasoning_content": None},
                                        "logprobs": None,
                                        "finish_reason": None,
                                        "matched_stop": None,
                                    }
                                ]
                            )
                        continue
                    reason, matched = finish_of(event["meta"])
                    yield chunk(
                        [
                            {
                                "index": 0,
                                "delta": {"reasoning_content": None},
                                "logprobs": None,
                                "finish_reason": reason,
                                "matched_stop": matched,
                            }
                        ]
                    )
                    if include_usage:
                        yield chunk([], usage=usage([event["meta"]]))
                yield b"data: [DONE]\n\n"

            return StreamingResponse(stream(), media_type="text/event-stream")
        events = await complete_n(prompt_ids, params, n)
        choices = []
        for index, event in enumerate(events):
            reason, matched = finish_of(event["meta"])
            choices.append(
                {
                    "index": index,
                    "message": {"role": "assistant", "content": event["text"], "reasoning_content": None},
                    "logprobs": None,
                    "finish_reason": reason,
                    "matched_stop": matched,
                }
            )
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": choices,
                "usage": usage([event["meta"] for event in events]),
                "metadata": {"weight_version": "default"},
            }
        )

    async def noop(request: Request) -> Response:
        return Response(status_code=200)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/health_generate", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model_detail, methods=["GET"]),
        Route("/model_info", model_info, methods=["GET"]),
        Route("/get_model_info", model_info, methods=["GET"]),
        Route("/server_info", server_info, methods=["GET"]),
        Route("/get_server_info", server_info, methods=["GET"]),
        Route("/generate", generate, methods=["POST", "PUT"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/flush_cache", noop, methods=["GET", "POST"]),
        Route("/freeze_gc", noop, methods=["GET", "POST"]),
    ]
    if state.enable_metrics:
        routes.append(Route("/metrics", metrics, methods=["GET"]))

    async def http_error(request: Request, exc: HTTPException) -> Response:
        # FastAPI's answer for an unknown route (404) or method (405): JSON {"detail": ...}.
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    if state.api_key or state.admin_api_key:
        app.add_middleware(ApiKeyMiddleware, state=state)
    return app


class ApiKeyMiddleware:
    """SGLang's rule (``sglang.srt.utils.auth.decide_request_auth``): health/ready/metrics always
    open, everything else needs ``Authorization: Bearer <api key>`` -> 401 ``{"error": "Unauthorized"}``."""

    def __init__(self, app, state: ServerState):
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from sglang.srt.utils.auth import AuthLevel, decide_request_auth  # noqa: PLC0415

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        decision = decide_request_auth(
            method=scope.get("method", "GET"),
            path=scope.get("path", "/"),
            authorization_header=headers.get("authorization"),
            api_key=self.state.api_key,
            admin_api_key=self.state.admin_api_key,
            auth_level=AuthLevel.NORMAL,
        )
        if not decision.allowed:
            response = JSONResponse(
                {"error": "Unauthorized" if decision.error_status_code == 401 else "Forbidden"},
                status_code=decision.error_status_code,
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
