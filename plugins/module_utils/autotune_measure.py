# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Measuring one server setting under the declared load, for the autotune choice (docs/autotune.md).

The measuring step's client: it waits for a freshly started server, then talks to it through the health
gate's own HTTP client (health_gate.ServiceIO.request: plain http.client, the API key, nothing to install
on the host) and returns measurements in the shape ddtree.sglang.service_autotune takes. Starting a
server per setting is service_autotune_trial's part (autotune_trials.py says which files and commands).

Requests are SGLang's native /generate, greedy: its meta_info has each request's completion tokens and
verify steps, so the acceptance length is measured on the same requests as the speed (the OpenAI routes
do not report it, and /server_info's average spans the server's whole life).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.ddtree.sglang.plugins.module_utils.health_gate import describe

# Each level sends at least this many requests per slot, so every slot is refilled at least once and
# the server sees a steady load, not one burst that drains.
ROUNDS = 2

# The fixed prompt set every setting is measured with, shipped with the collection (in the module, so
# nothing is copied to the host). Its name is part of the tuning key: change a prompt, change the name,
# and every service is tuned again. Mixed on purpose - code, prose, a list, arithmetic - because the
# acceptance length (and so the best tree) depends on how predictable the text is.
PROMPT_SET = "autotune-v1"
PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Explain in a few sentences how a hash map handles collisions.",
    "List the planets of the solar system in order from the sun, one per line.",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "Summarise the causes of the French Revolution in one paragraph.",
    "Write a bash script that counts the lines of every .py file under the current directory.",
    "What is 17 multiplied by 23? Show the steps.",
    "Translate into French: The weather is nice today, so we will walk to the station.",
]


# The measuring's options, as service_autotune_measure and service_autotune_trial both take them (their
# documentation is the doc fragment ddtree.sglang.autotune_workload).
WORKLOAD_ARGUMENT_SPEC = dict(
    max_tokens=dict(type="int", default=128, no_log=False),
    warmup=dict(type="int", default=1),
    request_timeout=dict(type="float", default=300.0),
)
# The setting a temporary instance runs, as service_autotune returns it in `trials`.
SETTING_OPTIONS = dict(
    algorithm=dict(type="str", required=True, choices=["DFLASH", "DDTREE", "NONE"]),
    budget=dict(type="int"),
    top_k=dict(type="int"),
)


def workload_problem(params: dict) -> str | None:
    """What is wrong with a measurement's numbers (max_tokens, warmup, start_timeout, request_timeout,
    concurrency in `params`), naming the value and the bound, or None."""
    for name in ("max_tokens", "start_timeout", "request_timeout"):
        if params[name] <= 0:
            return "%s is %s; it must be above 0" % (name, params[name])
    if params["warmup"] < 0 or not params["concurrency"] or any(value < 1 for value in params["concurrency"]):
        return "warmup must be >= 0 and concurrency a non-empty list of integers >= 1 (got %s, %s)" % (
            params["warmup"],
            params["concurrency"],
        )
    return None


def workload(max_tokens: int, warmup: int) -> dict:
    """What the measuring sends, as the tuning key records it: a different workload tunes again."""
    return {"prompts": PROMPT_SET, "max_tokens": max_tokens, "warmup": warmup, "rounds": ROUNDS}


def wait_ready(
    request, unit_state, timeout: float, poll: float = 2.0, clock=time.monotonic, sleep=time.sleep
) -> str | None:
    """Wait until a freshly started server answers GET /health with 200 -> None, or why not: its unit
    stopped (unit_state() is "failed" or "inactive": a setting the server refuses, e.g. a budget the
    drafter cannot verify, exits at start) or `timeout` seconds passed."""
    deadline = clock() + timeout
    last = "no answer yet"
    while True:
        answer = request("GET", "/health", None, timeout=max(1.0, min(10.0, deadline - clock())))
        if answer["status"] == 200:
            return None
        last = describe(answer)
        state = unit_state()
        if state in ("failed", "inactive"):
            return "the server exited before it was ready (unit %s; last /health: %s)" % (state, last)
        if clock() >= deadline:
            return "the server was not ready within %g s (last /health: %s)" % (timeout, last)
        sleep(poll)


def generate_once(request, prompt: str, max_tokens: int, timeout: float) -> dict:
    """One greedy /generate -> {"completion_tokens", "verify_steps", "seconds", "error"}."""
    body = {"text": prompt, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0}}
    answer = request("POST", "/generate", body, timeout=timeout, auth=True)
    meta = answer["data"].get("meta_info") if answer["status"] == 200 and isinstance(answer["data"], dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("completion_tokens"), int):
        problem = (
            describe(answer)
            if answer["error"] or answer["status"] != 200
            else ("an answer without meta_info.completion_tokens: %s" % answer["text"][:200])
        )
        return {"completion_tokens": None, "verify_steps": None, "seconds": answer["seconds"], "error": problem}
    steps = meta.get("spec_verify_ct")
    return {
        "completion_tokens": meta["completion_tokens"],
        "verify_steps": steps if isinstance(steps, int) else None,
        "seconds": answer["seconds"],
        "error": None,
    }


def level_prompts(prompts: list, concurrency: int, rounds: int = ROUNDS) -> list:
    """The requests of one concurrency level: every prompt at least once, and at least rounds x
    concurrency requests, cycling through the prompts in order (the same list for every setting)."""
    count = max(len(prompts), rounds * concurrency)
    return [prompts[index % len(prompts)] for index in range(count)]


def measure_load(
    request, prompts: list, concurrency: int, max_tokens: int, timeout: float, clock=time.monotonic
) -> dict:
    """Send level_prompts(prompts, concurrency) with `concurrency` requests in flight at a time.

    -> {"concurrency", "tokens_per_second": all completion tokens / wall seconds of the level, or None,
        "accept_length": completion tokens / verify steps, or None (no speculative decoding), "requests",
        "completion_tokens", "seconds", "error": the first failed request's, or None}.
    A level with any failed request has no tokens/s: it failed, and its setting is not chosen.
    """
    batch = level_prompts(prompts, concurrency)
    started = clock()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        answers = list(pool.map(lambda prompt: generate_once(request, prompt, max_tokens, timeout), batch))
    seconds = clock() - started
    failed = [answer["error"] for answer in answers if answer["error"]]
    tokens = sum(answer["completion_tokens"] or 0 for answer in answers)
    steps = [answer["verify_steps"] for answer in answers]
    result = {
        "concurrency": concurrency,
        "requests": len(answers),
        "completion_tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_second": None,
        "accept_length": None,
        "error": None,
    }
    if failed:
        result["error"] = "%d of %d requests failed, the first: %s" % (len(failed), len(answers), failed[0])
    elif tokens <= 0 or seconds <= 0:
        result["error"] = "no completion tokens were generated"
    else:
        result["tokens_per_second"] = round(tokens / seconds, 3)
        if all(isinstance(step, int) and step > 0 for step in steps):
            result["accept_length"] = round(tokens / sum(steps), 3)
    return result


def failed_setting(setting: dict, concurrencies: list, error: str) -> list:
    """A setting that could not be measured: one failed measurement per concurrency (never chosen)."""
    return [
        dict(setting, concurrency=concurrency, tokens_per_second=None, accept_length=None, error=error)
        for concurrency in sorted(concurrencies)
    ]


def measure_setting(
    request,
    setting: dict,
    concurrencies: list,
    prompts: list,
    max_tokens: int = 256,
    timeout: float = 300.0,
    warmup: int = 1,
    clock=time.monotonic,
) -> list:
    """One running setting ({"algorithm", "budget", "top_k"}) at every declared concurrency, lowest first
    -> service_autotune's measurements. `warmup` requests go first, unmeasured (a fresh server's first
    requests pay for lazy initialisation). A failed warm-up fails every level without sending it."""
    for prompt in prompts[:warmup]:
        answer = generate_once(request, prompt, max_tokens, timeout)
        if answer["error"]:
            return failed_setting(setting, concurrencies, "the warm-up request failed: %s" % answer["error"])
    measurements = []
    for concurrency in sorted(concurrencies):
        level = measure_load(request, prompts, concurrency, max_tokens, timeout, clock)
        measurements.append(
            dict(
                setting,
                concurrency=concurrency,
                tokens_per_second=level["tokens_per_second"],
                accept_length=level["accept_length"],
                error=level["error"],
                requests=level["requests"],
                completion_tokens=level["completion_tokens"],
                seconds=level["seconds"],
            )
        )
    return measurements


def measure_instance(
    request,
    unit_state,
    setting: dict,
    concurrencies: list,
    max_tokens: int,
    warmup: int,
    start_timeout: float,
    request_timeout: float,
    clock=time.monotonic,
) -> dict:
    """A freshly started server of one setting, waited for and measured -> {measurements, ready_s}. A server
    that is not ready (wait_ready says why) is a failed setting at every concurrency, not an error: it is never
    chosen, and the other settings are still measured. ready_s: seconds until /health answered 200, or None."""
    started = clock()
    problem = wait_ready(request, unit_state, start_timeout)
    if problem:
        return {"measurements": failed_setting(setting, concurrencies, problem), "ready_s": None}
    ready_s = round(clock() - started, 1)
    measurements = measure_setting(request, setting, concurrencies, PROMPTS, max_tokens, request_timeout, warmup)
    return {"measurements": measurements, "ready_s": ready_s}
