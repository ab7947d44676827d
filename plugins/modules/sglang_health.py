#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_health
short_description: Decide fast whether a (re)started SGLang service is healthy
version_added: 0.1.0
description:
  - Runs on the GPU host after the unit C(sglang-<name>.service) was (re)started and checks it in six
    stages, each failing fast with the stage's name and its evidence; a failure is the signal to roll back.
  - C(unit_watch) - every O(poll_interval) seconds reads the unit's state (C(systemctl show)) and its
    journal since the start (C(journalctl -u)). A fatal signature in the journal (a rejected flag, a
    scheduler exception, C(Received sigquit), a traceback, CUDA out of memory, an undefined symbol, a
    plugin that failed to load, an unknown speculative algorithm, ...), a failed, exited or
    auto-restarted unit fail at once. The unit's C(Result) and the kernel log tell a host OOM from
    SGLang's own SIGKILL of its process tree and from a bad flag (exit status 2). Progress markers
    (C(Load weight begin/end), CUDA-graph capture, C(Uvicorn running on), C(fired up)) reset a
    no-progress deadline; O(start_timeout) caps the start. The stage ends when the port answers.
  - C(health) - O(health_path) (which generates a token) must answer 200 within O(health_timeout);
    503s or timeouts while the unit is up mean the server is hung. C(/v1/models) answering is not health.
  - C(chat) - a fixed chat completion (O(chat_prompt), temperature 0) must answer within O(request_timeout).
  - C(degenerate) - the chat's text must not be empty, one character repeated (C(!!!!!!!!)), made of very
    few distinct characters, or end in a short loop.
  - C(baseline) - greedy outputs for O(prompts) must equal the baseline recorded in O(baseline_file)
    for the same model and O(max_tokens) (speculative decoding is lossless), within O(baseline_tolerance).
  - C(performance) - tokens/s over the baseline generations and the acceptance length
    (C(/server_info)) must meet O(min_tokens_per_second) and O(min_accept_length) and must not have
    regressed by more than O(max_regression) from the previous release (O(previous) or O(metrics_file)).
  - While later stages run, the unit and journal are still watched, so a crash during a request is
    reported as the crash it is.
  - The rules are in C(plugins/module_utils/health.py) and C(docs/health-gate.md).
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  name:
    description: The service's name; the unit is C(sglang-<name>.service).
    type: str
    required: true
  host:
    description:
      - Address the service listens on. C(0.0.0.0) and C(::) are reached through C(127.0.0.1).
    type: str
    default: 127.0.0.1
  port:
    description: Port the service listens on.
    type: int
    default: 30000
  model:
    description:
      - The served model name, used in requests and as the key of baselines and metrics.
      - Defaults to the first model C(/v1/models) lists (read once the server is healthy).
    type: str
  api_key:
    description:
      - "The service's API key, sent as C(Authorization: Bearer <key>) to the OpenAI-compatible endpoints
        and C(/server_info). Never returned or logged."
    type: str
  since:
    description:
      - Start of the journal to read, as C(journalctl --since) takes it (for example
        C(2026-11-30 10:00:00) recorded by the caller just before the restart).
      - Defaults to the unit's last start (C(InactiveExitTimestamp)). Passing it is better - it keeps
        lines of an automatic restart's earlier attempts in view.
    type: str
  poll_interval:
    description: Seconds between two looks at the unit, the journal and the port.
    type: float
    default: 2
  no_progress_timeout:
    description: Seconds without a new progress marker (or the port opening) before the start is declared stuck.
    type: float
    default: 120
  start_timeout:
    description: Seconds the whole start may take, from the gate's start until the port answers.
    type: float
    default: 900
  health_timeout:
    description:
      - Seconds after the port opened within which O(health_path) must answer 200 (retried until then).
        SGLang's warm-up request runs in this window.
    type: float
    default: 30
  health_path:
    description:
      - The health endpoint. Both generate one token in SGLang 0.5.23; C(/health_generate) does so even
        when C(SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false) makes C(/health) answer from memory.
    type: str
    choices: [/health, /health_generate]
    default: /health
  request_timeout:
    description: Seconds one chat or baseline request may take.
    type: float
    default: 60
  chat_prompt:
    description: The user message of the chat stage.
    type: str
    default: "In one sentence: what is the capital of France, and which river runs through it?"
  chat_max_tokens:
    description: C(max_tokens) of the chat stage.
    type: int
    default: 32
  prompts:
    description:
      - Fixed prompts (user messages) generated greedily for the baseline comparison and the speed
        measurement. An empty list skips the C(baseline) and C(performance) stages' generations.
    type: list
    elements: str
    default:
      - "List the first ten prime numbers, separated by commas."
      - "Write a Python function that returns the n-th Fibonacci number."
      - "Translate into German and Japanese: The weather is nice today."
  max_tokens:
    description: C(max_tokens) of each baseline generation.
    type: int
    default: 64
  baseline_file:
    description:
      - JSON file on the host with the baseline outputs, keyed by model, O(max_tokens) and prompt.
      - Unset, outputs are only checked for degeneracy.
    type: path
  record_baseline:
    description:
      - Record the outputs of prompts that have no baseline yet (when every stage passed), so the
        first healthy release sets the baseline. Off, missing baselines only warn.
    type: bool
    default: true
  baseline_tolerance:
    description:
      - C(0) - outputs must equal the baseline character for character.
      - Otherwise the share of the baseline's length that may differ at the end (a late near-tie flip).
    type: float
    default: 0
  min_tokens_per_second:
    description: Floor for the tokens/s measured over the baseline generations (one request at a time).
    type: float
  min_accept_length:
    description:
      - Floor for the average acceptance length SGLang reports; failing when none is reported.
    type: float
  previous:
    description:
      - The previous release's numbers, C(tokens_per_second) and C(accept_length). Takes precedence
        over O(metrics_file).
    type: dict
  metrics_file:
    description:
      - JSON file on the host with recorded metrics; its last record for the model is the previous
        release's numbers. O(record_metrics=true) appends the new numbers when every stage passed.
    type: path
  max_regression:
    description:
      - Largest allowed drop from the previous release's numbers, as a fraction (C(0.5) - fail below
        50% of the previous tokens/s or acceptance length).
    type: float
    default: 0.5
  record_metrics:
    description: Append this run's numbers to O(metrics_file) when every stage passed.
    type: bool
    default: false
  release:
    description: A label (the release id) stored with recorded baselines and metrics.
    type: str
  extra_signatures:
    description: More journal substrings (case-insensitive) that mean a fatal error.
    type: list
    elements: str
    default: []
  extra_progress_markers:
    description: More journal substrings (case-insensitive) that mean the start is progressing.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    description: Runs every check (they only read and generate); records nothing, reports C(changed) when it would.
  diff_mode:
    support: none
    description: Recording a baseline or metrics is reported in RV(recorded), not as a diff.
notes:
  - Needs C(systemctl) and C(journalctl) on the host; run it with C(become) to read the journal and kernel log.
  - Health and C(/metrics) need no API key in SGLang; C(/v1/*) and C(/server_info) do.
seealso:
  - module: ddtree.sglang.service_link
"""

EXAMPLES = r"""
- name: Record when the restart begins
  ansible.builtin.command: date '+%Y-%m-%d %H:%M:%S'
  register: restart_time
  changed_when: false

- name: Restart the service
  ansible.builtin.systemd_service:
    name: sglang-coder.service
    state: restarted

- name: Gate the service
  ddtree.sglang.sglang_health:
    name: coder
    port: 30000
    api_key: "{{ vault_sglang_coder_api_key }}"
    since: "{{ restart_time.stdout }}"
    baseline_file: /var/lib/sglang/coder/baseline.json
    metrics_file: /var/lib/sglang/coder/metrics.json
    record_metrics: true
    min_accept_length: 2.0
    release: "{{ release_id }}"
  register: gate
  become: true

- name: Look without recording anything
  ddtree.sglang.sglang_health:
    name: coder
    prompts: []
  check_mode: true
"""

RETURN = r"""
stage:
  description: The last stage reached (C(unit_watch), C(health), C(chat), C(degenerate), C(baseline), C(performance)).
  returned: always
  type: str
  sample: performance
passed:
  description: Whether every stage passed.
  returned: always
  type: bool
failed_stage:
  description: The stage that failed.
  returned: failure
  type: str
  sample: unit_watch
failure_kind:
  description:
    - What failed, for example C(bad_flag), C(oom), C(self_kill), C(scheduler_exception), C(plugin),
      C(unknown_algorithm), C(cuda_oom), C(restarted), C(no_progress), C(start_timeout), C(hung),
      C(chat), C(degenerate), C(baseline_mismatch), C(performance).
  returned: failure
  type: str
  sample: self_kill
service:
  description: The service gated (I(name)).
  returned: always
  type: str
  sample: coder
release:
  description: The release gated (I(release)), for reports; null when not given.
  returned: always
  type: str
  sample: 9c1d0b7e3f2a
unit:
  description: The unit's name.
  returned: always
  type: str
  sample: sglang-coder.service
unit_state:
  description: The unit's last C(systemctl show) properties and the verdict on them.
  returned: always
  type: dict
  sample: {properties: {ActiveState: failed, Result: signal, ExecMainStatus: "9"}, phase: failed, kind: killed}
timings:
  description: Seconds each stage took, and C(total).
  returned: always
  type: dict
  sample: {unit_watch: 41.2, health: 1.1, chat: 0.4, degenerate: 0.0, baseline: 2.2, performance: 0.1, total: 45.0}
startup:
  description:
    - The start's milestones, in seconds from C(measured_from) (the unit's start when systemd tells it,
      else the gate's start). C(progress) lists the markers seen.
  returned: always
  type: dict
  sample: {since: "2026-11-30 10:00:00", measured_from: unit start, time_to_first_progress_s: 6.1,
           time_to_port_s: 40.8, progress: [{marker: load_weight_begin, at_s: 6.1}]}
health:
  description: The health stage - the final status, its latency, and the attempts.
  returned: when reached
  type: dict
  sample: {path: /health, status: 200, latency_s: 1.02, attempts: [{status: 503, seconds: 20.0, error: null}]}
chat:
  description: The chat completion - its text (at most 500 characters), tokens, finish reason and latency.
  returned: when reached
  type: dict
  sample: {text: "The capital of France is Paris, on the Seine.", completion_tokens: 14, finish_reason: stop, latency_s: 0.41}
degenerate:
  description: The degenerate-output verdict on the chat text (and which rule fired).
  returned: when reached
  type: dict
  sample: {degenerate: true, rule: one_char, reason: "the output is one character repeated: '!' x 32"}
baseline:
  description:
    - The baseline comparison. C(status) is C(passed), C(failed), C(recorded) (some baselines were new),
      C(missing) (no baseline and not recording) or C(skipped); C(results) has one entry per prompt.
  returned: when reached
  type: dict
  sample: {status: passed, file: /var/lib/sglang/coder/baseline.json, model: coder,
           results: [{prompt: "List the first ten prime numbers, separated by commas.", status: match, differing_chars: 0}]}
performance:
  description: Tokens/s, acceptance length, the previous numbers and floors compared with, and the problems found.
  returned: when reached
  type: dict
  sample: {tokens_per_second: 182.4, accept_length: 3.41, completion_tokens: 192, generation_s: 1.05,
           previous: {tokens_per_second: 175.0, accept_length: 3.38}, problems: []}
recorded:
  description: What was recorded (or, in check mode, would have been).
  returned: always
  type: dict
  sample: {baseline: true, metrics: false}
signature_matches:
  description: Fatal journal lines found, each with the signature, its kind and context lines.
  returned: failure
  type: list
  elements: dict
journal_excerpt:
  description: The last lines of the unit's journal since the start.
  returned: failure
  type: list
  elements: str
kernel_log:
  description: Kernel log lines that show the OOM killer hit this unit.
  returned: failure, when the process died by a signal
  type: list
  elements: str
"""

import json
import os
import socket
import tempfile
import time
import urllib.error

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.ddtree.sglang.plugins.module_utils.health import (
    UNIT_PROPERTIES,
    StartWatch,
    baseline_add,
    baseline_lookup,
    compare_metrics,
    compare_output,
    degenerate_output,
    kernel_oom_lines,
    metrics_add,
    parse_systemctl_show,
    previous_metrics,
    redact,
    split_journal_output,
    tokens_per_second,
    wants_kernel_log,
)

TEXT_LIMIT = 500


class GateFailed(Exception):
    def __init__(self, kind, reason, **evidence):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.evidence = evidence


class HealthGate:
    """The I/O around health.py's rules: systemctl, journalctl, the port and HTTP."""

    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.unit = "sglang-%s.service" % self.params["name"]
        self.systemctl = module.get_bin_path("systemctl", required=True)
        self.journalctl = module.get_bin_path("journalctl", required=True)
        host = self.params["host"]
        self.connect_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        url_host = "[%s]" % self.connect_host if ":" in self.connect_host else self.connect_host
        self.base_url = "http://%s:%d" % (url_host, self.params["port"])
        self.cursor = None
        self.since = None
        self.watch = None
        self.t0 = time.monotonic()
        self.origin = self.t0
        self.stage = "unit_watch"
        self.result = {"unit": self.unit, "service": self.params["name"], "release": self.params["release"],
                       "stage": self.stage, "passed": False, "timings": {},
                       "recorded": {"baseline": False, "metrics": False}, "unit_state": {}}
        self.pending = {}  # what to record once every stage passed
        self.model = self.params["model"]
        self.chat_text = ""
        self.generations = []

    # ---- host I/O --------------------------------------------------------------------------------

    def unit_props(self):
        command = [self.systemctl, "show", self.unit, "-p", ",".join(UNIT_PROPERTIES)]
        rc, out, err = self.module.run_command(command)
        if rc != 0:
            raise GateFailed("systemctl", "%s exited with %d: %s" % (" ".join(command), rc, (err or out).strip()[:500]))
        props = parse_systemctl_show(out)
        self.result["unit_state"]["properties"] = props
        return props

    def journal_lines(self):
        command = [self.journalctl, "-u", self.unit, "--no-pager", "-q", "-o", "cat", "--show-cursor"]
        command += ["--after-cursor", self.cursor] if self.cursor else ["--since", self.since]
        rc, out, err = self.module.run_command(command)
        if rc != 0 and err.strip():
            raise GateFailed("journal", "%s exited with %d: %s" % (" ".join(command), rc, err.strip()[:500]))
        lines, cursor = split_journal_output(out)
        self.cursor = cursor or self.cursor
        return lines

    def kernel_lines(self):
        rc, out, _err = self.module.run_command(
            [self.journalctl, "-k", "--no-pager", "-q", "-o", "short-precise", "--since", self.since])
        return out.splitlines() if rc == 0 else []

    def port_open(self):
        try:
            with socket.create_connection((self.connect_host, self.params["port"]),
                                          timeout=max(0.2, min(1.0, self.params["poll_interval"]))):
                return True
        except OSError:
            return False

    def request(self, method, path, body=None, timeout=10.0, auth=False):
        """-> {"status": int or None, "data": parsed JSON or None, "text": str, "seconds", "error": str or None}."""
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body)
        if auth and self.params["api_key"]:
            headers["Authorization"] = "Bearer %s" % self.params["api_key"]
        start = time.monotonic()
        status, text, error = None, "", None
        try:
            response = open_url(self.base_url + path, data=data, headers=headers, method=method, timeout=timeout,
                                use_proxy=False, follow_redirects="none", use_netrc=False)
            status = response.getcode()
            text = response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            status = exc.code
            try:
                text = exc.read().decode("utf-8", "replace")
            except Exception:  # the body of an error is only evidence
                text = ""
        except (urllib.error.URLError, socket.timeout, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, socket.timeout) or "timed out" in str(reason):
                error = "timed out after %.1f s" % timeout
            else:
                error = "%s: %s" % (type(reason).__name__, reason)
        except Exception as exc:  # http.client's RemoteDisconnected, IncompleteRead, ...
            error = "%s: %s" % (type(exc).__name__, exc)
        seconds = round(time.monotonic() - start, 3)
        parsed = None
        if text:
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = None
        key = self.params["api_key"]
        return {"status": status, "data": parsed, "text": redact(text[:TEXT_LIMIT], key), "seconds": seconds,
                "error": redact(error, key)}

    # ---- unit watch ------------------------------------------------------------------------------

    def since_of(self, props):
        if self.params["since"]:
            return self.params["since"]
        stamp = props.get("InactiveExitTimestamp", "")
        return stamp if stamp and stamp != "n/a" else "now"

    def watch_once(self, port_open=False):
        props = self.unit_props()
        lines = self.journal_lines()
        state = self.watch.feed(time.monotonic(), props, lines, port_open)
        self.result["unit_state"].update({key: self.watch.unit.get(key) for key in ("phase", "kind", "reason", "state")})
        return state

    def fail_from_watch(self):
        """The watch failed: fetch the kernel log when it may tell an OOM, and raise with the evidence."""
        evidence = {}
        if wants_kernel_log(self.watch.unit):
            pids = [self.result["unit_state"]["properties"].get("ExecMainPID")]
            oom = kernel_oom_lines(self.kernel_lines(), self.unit, pids)
            evidence["kernel_log"] = oom
            self.watch.refine(oom)
        failure = self.watch.failure
        raise GateFailed(failure["kind"], failure["reason"], **evidence)

    def check_unit(self):
        """Between requests: fail (after the settle poll) if the unit or journal shows a fatal error."""
        state = self.watch_once(port_open=True)
        while state["state"] == "failing":
            time.sleep(self.params["poll_interval"])
            state = self.watch_once(port_open=True)
        if state["state"] == "failed":
            self.fail_from_watch()

    def stage_unit_watch(self):
        props = self.unit_props()
        self.since = self.since_of(props)
        started = int(props.get("ActiveEnterTimestampMonotonic") or 0) / 1e6
        measured_from = "gate start"
        if 0 < started <= self.t0:
            self.origin, measured_from = started, "unit start"
        self.watch = StartWatch(
            started_at=self.t0,
            no_progress_timeout=self.params["no_progress_timeout"],
            start_timeout=self.params["start_timeout"],
            settle_seconds=self.params["poll_interval"],
            extra_signatures=self.params["extra_signatures"],
            extra_progress_markers=self.params["extra_progress_markers"],
        )
        self.result["startup"] = {"since": self.since, "measured_from": measured_from}
        while True:
            state = self.watch_once(port_open=self.port_open())
            self.record_startup()
            if state["state"] == "failed":
                self.fail_from_watch()
            if state["state"] == "ready":
                return
            time.sleep(self.params["poll_interval"])

    def record_startup(self):
        def rel(moment):
            return None if moment is None else round(moment - self.origin, 3)

        self.result["startup"].update({
            "time_to_first_progress_s": rel(self.watch.first_progress_at),
            "time_to_port_s": rel(self.watch.port_at),
            "progress": [{"marker": p["marker"], "at_s": rel(p["at"])} for p in self.watch.progress],
        })

    # ---- health, chat, outputs -------------------------------------------------------------------

    def stage_health(self):
        path = self.params["health_path"]
        deadline = time.monotonic() + self.params["health_timeout"]
        attempts = []
        self.result["health"] = {"path": path, "status": None, "latency_s": None, "attempts": attempts}
        while True:
            remaining = deadline - time.monotonic()
            answer = self.request("GET", path, timeout=max(1.0, remaining))
            attempts.append({"status": answer["status"], "seconds": answer["seconds"], "error": answer["error"]})
            del attempts[:-10]
            self.result["health"].update(status=answer["status"], latency_s=answer["seconds"])
            if answer["status"] == 200:
                return
            self.check_unit()
            if time.monotonic() >= deadline:
                break
            time.sleep(max(0.0, min(self.params["poll_interval"], deadline - time.monotonic())))
        models = self.request("GET", "/v1/models", timeout=5.0, auth=True)
        self.result["health"]["v1_models_status"] = models["status"]
        answered = [a for a in attempts if a["status"] is not None or (a["error"] or "").startswith("timed out")]
        kind = "hung" if len(answered) == len(attempts) else "unreachable"
        seen = ", ".join(str(a["status"]) if a["status"] is not None else a["error"] for a in attempts)
        reason = "%s did not answer 200 within %g s although the unit is %s (%s)" % (
            path, self.params["health_timeout"], self.result["unit_state"].get("state"), seen)
        if kind == "hung":
            reason += "; the scheduler is hung"
        if models["status"] == 200:
            reason += "; /v1/models still answers 200 (answered from memory, it is not health)"
        raise GateFailed(kind, reason)

    def model_name(self):
        if self.model:
            return self.model
        answer = self.request("GET", "/v1/models", timeout=self.params["request_timeout"], auth=True)
        try:
            return answer["data"]["data"][0]["id"]
        except (TypeError, KeyError, IndexError):
            raise GateFailed("chat", "could not read the served model name from /v1/models (%s): %s" % (
                answer["status"] or answer["error"], answer["text"][:200]))

    def generate(self, prompt, max_tokens, what):
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens, "temperature": 0}
        answer = self.request("POST", "/v1/chat/completions", body, timeout=self.params["request_timeout"], auth=True)
        problem = None
        if answer["error"]:
            problem = answer["error"]
        elif answer["status"] != 200:
            problem = "HTTP %s: %s" % (answer["status"], answer["text"][:300])
        else:
            try:
                choice = answer["data"]["choices"][0]
                text = choice["message"]["content"] or ""
                tokens = (answer["data"].get("usage") or {}).get("completion_tokens")
                return {"text": text, "completion_tokens": tokens, "finish_reason": choice.get("finish_reason"),
                        "seconds": answer["seconds"]}
            except (TypeError, KeyError, IndexError):
                problem = "an answer that is not a chat completion: %s" % answer["text"][:300]
        self.check_unit()  # a crash explains a failed request better than the request does
        kind = "chat_timeout" if answer["error"] and answer["error"].startswith("timed out") else "chat"
        raise GateFailed(kind, "%s: /v1/chat/completions failed although %s answered 200: %s" % (
            what, self.params["health_path"], problem))

    def stage_chat(self):
        self.model = self.model_name()
        reply = self.generate(self.params["chat_prompt"], self.params["chat_max_tokens"], "the chat request")
        self.chat_text = reply["text"]
        self.result["chat"] = {"text": reply["text"][:TEXT_LIMIT], "completion_tokens": reply["completion_tokens"],
                               "finish_reason": reply["finish_reason"], "latency_s": reply["seconds"], "model": self.model}

    def stage_degenerate(self):
        verdict = degenerate_output(self.chat_text)
        self.result["degenerate"] = verdict
        if verdict["degenerate"]:
            raise GateFailed("degenerate", "the chat output is degenerate: %s" % verdict["reason"])

    def stage_baseline(self):
        path = self.params["baseline_file"]
        document = read_json(path) if path else None
        status = "skipped" if not path else "passed"
        results = []
        self.result["baseline"] = {"status": status, "file": path, "model": self.model, "results": results}
        new_document = document
        mismatches = []
        for prompt in self.params["prompts"]:
            reply = self.generate(prompt, self.params["max_tokens"], "baseline prompt %r" % prompt[:60])
            self.generations.append(reply)
            entry = {"prompt": prompt, "text": reply["text"][:TEXT_LIMIT], "completion_tokens": reply["completion_tokens"],
                     "seconds": reply["seconds"]}
            results.append(entry)
            verdict = degenerate_output(reply["text"])
            if verdict["degenerate"]:
                entry["status"] = "degenerate"
                raise GateFailed("degenerate", "the output for baseline prompt %r is degenerate: %s" % (prompt[:60], verdict["reason"]))
            if not path:
                entry["status"] = "unchecked"
                continue
            recorded = baseline_lookup(document, self.model, prompt, self.params["max_tokens"])
            if recorded is None:
                if self.params["record_baseline"]:
                    entry["status"] = "new"
                    new_document = baseline_add(new_document, self.model, prompt, self.params["max_tokens"], {
                        "text": reply["text"], "completion_tokens": reply["completion_tokens"],
                        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "release": self.params["release"]})
                else:
                    entry["status"] = "missing"
                continue
            comparison = compare_output(recorded.get("text", ""), reply["text"], self.params["baseline_tolerance"])
            entry.update(comparison, status="match" if comparison["match"] else "mismatch")
            if not comparison["match"]:
                mismatches.append((prompt, comparison))
        statuses = [entry["status"] for entry in results]
        if mismatches:
            self.result["baseline"]["status"] = "failed"
            prompt, comparison = mismatches[0]
            raise GateFailed("baseline_mismatch", (
                "%d of %d greedy outputs differ from the baseline for model %s (max_tokens %d); prompt %r differs "
                "after character %d (%d differ, %d allowed): expected %r, got %r") % (
                len(mismatches), len(results), self.model, self.params["max_tokens"], prompt[:60],
                comparison["common_prefix"], comparison["differing_chars"], comparison["allowed_chars"],
                comparison.get("expected_excerpt"), comparison.get("actual_excerpt")))
        if "new" in statuses:
            self.result["baseline"]["status"] = "recorded"
            self.pending["baseline"] = new_document
        elif "missing" in statuses:
            self.result["baseline"]["status"] = "missing"
            self.module.warn("%s: no baseline in %s for model %s (max_tokens %d) and record_baseline is false: outputs "
                             "were not compared" % (self.unit, path, self.model, self.params["max_tokens"]))

    def stage_performance(self):
        params = self.params
        current = {"tokens_per_second": tokens_per_second(self.generations), "accept_length": None}
        info = self.request("GET", "/server_info", timeout=params["request_timeout"], auth=True)
        try:
            current["accept_length"] = info["data"]["internal_states"][0].get("avg_spec_accept_length")
        except (TypeError, KeyError, IndexError, AttributeError):
            current["server_info_error"] = info["error"] or "HTTP %s" % info["status"]
        previous = params["previous"]
        if previous is None and params["metrics_file"]:
            previous = previous_metrics(read_json(params["metrics_file"]), self.model)
        floors = {"tokens_per_second": params["min_tokens_per_second"], "accept_length": params["min_accept_length"]}
        problems = compare_metrics(current, floors, previous, params["max_regression"])
        self.result["performance"] = dict(
            current, completion_tokens=sum(g["completion_tokens"] or 0 for g in self.generations),
            generation_s=round(sum(g["seconds"] for g in self.generations), 3),
            previous=previous, floors=floors, max_regression=params["max_regression"], problems=problems)
        if problems:
            raise GateFailed("performance", "; ".join(problems))
        if params["record_metrics"]:
            self.pending["metrics"] = metrics_add(read_json(params["metrics_file"]), {
                "model": self.model, "release": params["release"],
                "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "tokens_per_second": current["tokens_per_second"], "accept_length": current["accept_length"],
                "prompts": len(self.generations), "max_tokens": params["max_tokens"]})

    # ---- the run ---------------------------------------------------------------------------------

    STAGES = ("unit_watch", "health", "chat", "degenerate", "baseline", "performance")

    def run(self):
        try:
            for stage in self.STAGES:
                self.stage = self.result["stage"] = stage
                start = time.monotonic()
                try:
                    getattr(self, "stage_" + stage)()
                finally:
                    self.result["timings"][stage] = round(time.monotonic() - start, 3)
        except GateFailed as failure:
            return self.failed(failure)
        for what, path in (("baseline", self.params["baseline_file"]), ("metrics", self.params["metrics_file"])):
            if what in self.pending:
                if not self.module.check_mode:
                    write_json(self.module, path, self.pending[what])
                self.result["recorded"][what] = True
        self.result["timings"]["total"] = round(time.monotonic() - self.t0, 3)
        self.result["passed"] = True
        changed = any(self.result["recorded"].values())
        summary = "%s is healthy: port after %s s, /health %s s, %s tokens/s, acceptance length %s" % (
            self.unit, self.result["startup"].get("time_to_port_s"), self.result["health"]["latency_s"],
            self.result.get("performance", {}).get("tokens_per_second"), self.result.get("performance", {}).get("accept_length"))
        self.module.exit_json(changed=changed, msg=summary, **self.result)

    def failed(self, failure):
        self.result["timings"]["total"] = round(time.monotonic() - self.t0, 3)
        if self.watch is not None:
            self.record_startup()
            self.result["journal_excerpt"] = self.watch.excerpt()
            self.result["signature_matches"] = self.watch.evidence()
        self.result.update(failure.evidence)
        self.result.update(failed_stage=self.stage, failure_kind=failure.kind)
        message = "%s failed at %s (%s): %s" % (self.unit, self.stage, failure.kind, failure.reason)
        self.module.fail_json(msg=redact(message, self.params["api_key"]), **self.result)


def read_json(path):
    """A JSON document on the host, or None when the file does not exist."""
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError) as exc:
        raise GateFailed("state_file", "cannot read %s: %s" % (path, exc))


def write_json(module, path, document):
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    fd, temp = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path))
    with os.fdopen(fd, "w") as handle:
        json.dump(document, handle, indent=2, sort_keys=True, ensure_ascii=False)
        handle.write("\n")
    os.chmod(temp, 0o644)
    module.atomic_move(temp, path)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            host=dict(type="str", default="127.0.0.1"),
            port=dict(type="int", default=30000),
            model=dict(type="str"),
            api_key=dict(type="str", no_log=True),
            since=dict(type="str"),
            poll_interval=dict(type="float", default=2),
            no_progress_timeout=dict(type="float", default=120),
            start_timeout=dict(type="float", default=900),
            health_timeout=dict(type="float", default=30),
            health_path=dict(type="str", choices=["/health", "/health_generate"], default="/health"),
            request_timeout=dict(type="float", default=60),
            chat_prompt=dict(type="str", default="In one sentence: what is the capital of France, and which river runs through it?"),
            chat_max_tokens=dict(type="int", default=32, no_log=False),
            prompts=dict(type="list", elements="str", default=[
                "List the first ten prime numbers, separated by commas.",
                "Write a Python function that returns the n-th Fibonacci number.",
                "Translate into German and Japanese: The weather is nice today.",
            ]),
            max_tokens=dict(type="int", default=64, no_log=False),
            baseline_file=dict(type="path"),
            record_baseline=dict(type="bool", default=True),
            baseline_tolerance=dict(type="float", default=0),
            min_tokens_per_second=dict(type="float", no_log=False),
            min_accept_length=dict(type="float"),
            previous=dict(type="dict"),
            metrics_file=dict(type="path"),
            max_regression=dict(type="float", default=0.5),
            record_metrics=dict(type="bool", default=False),
            release=dict(type="str"),
            extra_signatures=dict(type="list", elements="str", default=[]),
            extra_progress_markers=dict(type="list", elements="str", default=[]),
        ),
        required_if=[("record_metrics", True, ("metrics_file",))],
        supports_check_mode=True,
    )
    for option in ("poll_interval", "no_progress_timeout", "start_timeout", "health_timeout", "request_timeout"):
        if module.params[option] <= 0:
            module.fail_json(msg="%s must be positive, got %s" % (option, module.params[option]))
    HealthGate(module).run()


if __name__ == "__main__":
    main()
