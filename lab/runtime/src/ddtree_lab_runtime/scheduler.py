"""The lab scheduler: one worker thread that runs generation requests one at a time.

Like SGLang's scheduler process, it is the only place tokens are produced: when it hangs,
``/health`` (which waits for a token) fails while ``/v1/models`` (answered from memory) does not;
when it raises, the whole server dies the SGLang way ("Scheduler hit an exception", SIGQUIT to the
launcher, SIGKILL).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import signal
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from .decoding import Decoder, RequestStats, SamplingParams
from .faults import Faults
from .tokenizer import STOP_TOKEN_IDS, ByteTokenizer, IncrementalDecoder

logger = logging.getLogger("ddtree_lab_runtime")

TTFT_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 120.0, 160.0)
ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
)
_rid = itertools.count(1)


def stop_prefix_tail(text: str, stops: list) -> int:
    """Length of the longest end of text that is the beginning of a stop string (not yet streamable)."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def fatal(message: str) -> None:
    """SGLang's fatal path from a scheduler: log, SIGQUIT the launcher (it SIGKILLs the tree)."""
    logger.error(message)
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:
            pass
    os.kill(os.getpid(), signal.SIGQUIT)
    time.sleep(3.0)  # the launcher's handler runs in the main thread; make sure we die regardless
    os.kill(os.getpid(), signal.SIGKILL)


class Histogram:
    def __init__(self, buckets: tuple):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += times
        self.total += times
        self.sum += value * times


@dataclass
class GenRequest:
    prompt_ids: list
    params: SamplingParams
    kind: str = "user"  # "user" | "health" | "warmup"
    loop: Optional[asyncio.AbstractEventLoop] = None
    sink: Optional[asyncio.Queue] = None
    rid: str = field(default_factory=lambda: f"lab-{next(_rid)}")
    cancelled: bool = False
    created: float = field(default_factory=time.time)

    def push(self, event: dict) -> None:
        if self.loop is not None and self.sink is not None and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self.sink.put_nowait, event)
            except RuntimeError:  # loop closed during shutdown
                pass


@dataclass
class SpecTotals:
    forward_ct: int = 0
    accept_tokens: int = 0
    correct_drafts: int = 0


class SpecMetrics:
    """The server-wide speculative statistics as SGLang 0.5.23 keeps them
    (``scheduler_components/metrics_reporter.py``, ``report_decode_stats``; ``internal_state.py``,
    ``_average_accept_length``).

    Every decode batch counts (a verify step, or a plain one-token step); a verify step adds to a window.
    Only when the count of decode batches reaches a multiple of ``decode_log_interval`` (``--decode-log-interval``,
    40) is the window logged ("Decode batch, ... accept len: ...") and folded into the totals, and the
    totals are all ``/server_info``'s ``avg_spec_accept_length`` reads: a fresh server that ran fewer
    decode batches reports none (docs/decisions/accept-length-source.md). Per request,
    ``meta_info.spec_accept_length`` is there from the first verify step.
    """

    def __init__(self, decode_log_interval: int = 40):
        self.decode_log_interval = max(int(decode_log_interval), 1)
        self.decode_batches = 0
        self.window = SpecTotals()
        self.total = SpecTotals()
        self.logged = SpecTotals()  # the last window folded: what SGLang's /metrics gauges show (0 before)

    def decode_batch(self, step: Optional[tuple]) -> Optional[SpecTotals]:
        """One decode batch: (committed tokens, accepted drafts) of a verify step, or None for a plain
        step. -> the window just folded into the totals (to log), or None."""
        self.decode_batches += 1
        if step is not None:
            self.window.forward_ct += 1
            self.window.accept_tokens += step[0]
            self.window.correct_drafts += step[1]
        if self.decode_batches % self.decode_log_interval != 0:
            return None
        window, self.window = self.window, SpecTotals()
        self.logged = window
        self.total.forward_ct += window.forward_ct
        self.total.accept_tokens += window.accept_tokens
        self.total.correct_drafts += window.correct_drafts
        return window


class Scheduler:
    def __init__(self, decoder: Decoder, tokenizer: ByteTokenizer, faults: Faults, decode_log_interval: int = 40):
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.faults = faults
        self.queue: "queue.Queue[Optional[GenRequest]]" = queue.Queue()
        self.last_receive = 0.0  # time of the last token produced for any request
        self.armed = False  # faults that act "after start" act once the warm-up is done
        self.user_requests = 0
        self.running = 0
        self.spec_metrics = SpecMetrics(decode_log_interval)
        self.spec = self.spec_metrics.total  # what /server_info and /metrics report
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_requests_total = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self._recent = deque()  # (finished_at, tokens, seconds) for gen_throughput
        self.last_gen_throughput = 0.0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="lab-scheduler", daemon=True)

    # ---- API for the HTTP side ----

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: GenRequest) -> None:
        self.queue.put(request)

    def stop(self, timeout: float = 5.0) -> None:
        self.queue.put(None)
        self._thread.join(timeout)

    def queue_size(self) -> int:
        return self.queue.qsize()

    def avg_spec_accept_length(self) -> Optional[float]:
        """/server_info's average: the folded totals only (SpecMetrics); None before the first fold."""
        if not self.decoder.plan.speculative or self.spec.forward_ct <= 0:
            return None
        return self.accept_length(self.spec)

    def _log_decode_batch(self, window: SpecTotals, tokens: int) -> None:
        """SGLang's line, logged every decode_log_interval decode batches (SGLang 0.5.23's format)."""
        msg = f"Decode batch, #running-req: 1, #token: {tokens}, token usage: 0.00, "
        if self.decoder.plan.speculative:
            msg += f"accept len: {self.accept_length(window):.2f}, accept rate: {self.accept_rate(window):.2f}, "
        msg += f"cuda graph: False, gen throughput (token/s): {self.last_gen_throughput:.2f}, "
        msg += f"#queue-req: {self.queue_size()}"
        logger.info(msg)

    def spec_accept_rate(self) -> float:
        return self.accept_rate(self.spec)

    @staticmethod
    def accept_length(counts: SpecTotals) -> float:
        return counts.accept_tokens / counts.forward_ct if counts.forward_ct else 0.0

    def accept_rate(self, counts: SpecTotals) -> float:
        per_round = max(self.decoder.plan.num_draft_tokens - 1, 0)
        proposed = counts.forward_ct * per_round
        return counts.correct_drafts / proposed if proposed else 0.0

    def gen_throughput(self) -> float:
        now = time.time()
        with self._lock:
            while self._recent and now - self._recent[0][0] > 30.0:
                self._recent.popleft()
            tokens = sum(t for _, t, _ in self._recent)
            seconds = sum(s for _, _, s in self._recent)
        if seconds > 0:
            self.last_gen_throughput = tokens / seconds
        return self.last_gen_throughput

    # ---- the worker ----

    def _run(self) -> None:
        try:
            while True:
                request = self.queue.get()
                if request is None:
                    return
                if self.armed and self.faults.hang:
                    logger.warning("lab fault hang: the scheduler stops producing tokens")
                    threading.Event().wait()  # forever
                if request.cancelled:
                    continue
                if request.kind == "user" and self.armed:
                    self.user_requests += 1
                    if self.faults.crash_after is not None and self.user_requests > self.faults.crash_after:
                        raise RuntimeError(
                            f"lab fault crash_after:{self.faults.crash_after}: the scheduler failed on "
                            f"generation request {self.user_requests}"
                        )
                self._process(request)
        except Exception:
            fatal(f"Scheduler hit an exception: {traceback.format_exc()}")

    def _process(self, request: GenRequest) -> None:
        params = request.params
        text_decoder = IncrementalDecoder()
        state: dict[str, Any] = {"ids": [], "text": "", "sent": 0, "stop": None, "last": None}
        t0 = time.perf_counter()
        self.running = 1

        def emit(tokens: list) -> bool:
            now = time.perf_counter()
            self.last_receive = time.time()
            if state["last"] is not None and tokens:
                self.itl.observe((now - state["last"]) / len(tokens), len(tokens))
            state["last"] = now
            # Token by token, as SGLang checks stop strings: a speculative step accepts a block of tokens,
            # but the output ends with the token that completed a stop string (SGLang 0.5.23: completion_tokens
            # counts the words and the stop word, not the whole accepted block).
            taken = []
            for token in tokens:
                taken.append(token)
                state["ids"].append(token)
                if token not in STOP_TOKEN_IDS or not params.skip_special_tokens:
                    state["text"] += text_decoder.feed([token])
                for stop in params.stop or []:
                    idx = state["text"].find(stop)
                    if stop and idx != -1:
                        state["text"] = state["text"][:idx]
                        state["stop"] = stop
                        break
                if state["stop"] is not None:
                    break
            # Stream only what cannot become a stop string: hold back a tail that is a stop string's prefix.
            held = 0 if state["stop"] is not None else stop_prefix_tail(state["text"], params.stop or [])
            delta = state["text"][state["sent"] : len(state["text"]) - held]
            state["sent"] += len(delta)
            request.push({"type": "delta", "text": delta, "ids": taken})
            return state["stop"] is None and not request.cancelled

        try:
            stats: RequestStats = self.decoder.generate(
                request.prompt_ids, params, emit, stop_ids=self.tokenizer.stop_token_ids
            )
        finally:
            self.running = 0
        if state["stop"] is None:
            state["text"] += text_decoder.flush()
            tail = state["text"][state["sent"] :]  # what was held back as a possible stop string, too
            if tail:
                state["sent"] = len(state["text"])
                request.push({"type": "delta", "text": tail, "ids": []})
        elapsed = time.perf_counter() - t0
        # Tokens past a stop string were generated (the speculative block) but are not part of the output.
        completion_tokens = len(state["ids"]) if state["stop"] is not None else stats.completion_tokens
        if state["stop"] is not None:
            finish = {"type": "stop", "matched": state["stop"]}
        elif stats.finish_reason is not None:
            finish = stats.finish_reason
        else:
            finish = {"type": "abort", "message": "cancelled"}
        meta = {
            "id": request.rid,
            "finish_reason": finish,
            "prompt_tokens": len(request.prompt_ids),
            "completion_tokens": completion_tokens,
            "cached_tokens": 0,
            "weight_version": "default",
            "e2e_latency": time.time() - request.created,
        }
        if stats.spec_verify_ct > 0:
            proposed = stats.spec_verify_ct * max(self.decoder.plan.num_draft_tokens - 1, 0)
            meta["spec_verify_ct"] = stats.spec_verify_ct
            meta["spec_accept_length"] = completion_tokens / stats.spec_verify_ct
            meta["spec_accept_rate"] = stats.spec_num_correct_drafts / proposed if proposed else 0.0
            meta["spec_num_correct_drafts"] = stats.spec_num_correct_drafts
            meta["spec_num_proposed_drafts"] = proposed
        if request.kind != "health":
            with self._lock:
                for step in stats.decode_steps:
                    window = self.spec_metrics.decode_batch(step)
                    if window is not None:
                        self._log_decode_batch(window, len(request.prompt_ids) + stats.completion_tokens)
                self.prompt_tokens_total += len(request.prompt_ids)
                self.generation_tokens_total += stats.completion_tokens
                self.num_requests_total += 1
                if stats.completion_tokens:
                    self._recent.append((time.time(), stats.completion_tokens, max(elapsed, 1e-6)))
                    self.ttft.observe(stats.first_token_seconds)
        request.push({"type": "done", "text": state["text"], "ids": state["ids"], "meta": meta})
