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
    under the same baseline key and O(max_tokens) (speculative decoding is lossless), within
    O(baseline_tolerance). The key is the model, the decoding family (the speculative algorithm, DDTREE in
    DFLASH's family), the tensor-parallel size and the SGLang version, read from C(/server_info); a change
    of any of them changes greedy outputs legitimately, so it records a new baseline instead of failing.
  - C(performance) - tokens/s over the baseline generations and the acceptance length must meet
    O(min_tokens_per_second) and O(min_accept_length) and must not have regressed by more than
    O(max_regression) from the previous release (O(previous) or O(metrics_file)). The acceptance length
    is C(/server_info)'s C(avg_spec_accept_length); a speculative server that has none yet (SGLang 0.5.23
    averages only every C(--decode-log-interval), 40, decode batches, more than a fresh server has run)
    is asked for one more greedy generation of the first of O(prompts) through C(POST /generate), and
    its C(meta_info.spec_accept_length) is used. A tokens/s shortfall is measured again before it fails
    the stage (O(prompts) once more, and the faster round counts); a slow release is slow twice, a host busy
    for a moment is not.
  - While later stages run, the unit and journal are still watched. A request that fails makes the gate
    read the unit and its journal again; a server that died (the unit no longer runs, or its main PID
    changed) fails at C(unit_watch) with the cause (for example C(child_crashed), C(killed),
    C(restarted)), and RV(died_during) names the stage and request it interrupted. A request that fails
    on a unit that still runs is reported at its own stage.
  - The sequence is in C(plugins/module_utils/health_gate.py), its rules in C(health_journal.py),
    C(health_unit.py), C(health_output.py) and C(health_records.py) beside it, and C(docs/health-gate.md).
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
      - The served model name, used in requests and as part of the key of baselines and metrics.
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
      - JSON file on the host with the baseline outputs, keyed by the baseline key (model, decoding
        family, tensor-parallel size, SGLang version), O(max_tokens) and prompt.
      - Unset, outputs are only checked for degeneracy.
    type: path
  fleet_baselines:
    description:
      - The fleet's baselines (a document of O(baseline_file)'s format, each entry with the C(host) and
        C(release_id) it was recorded by), for prompts that O(baseline_file) has no baseline for under
        the key - a blank host's first release is compared with what another host recorded, not taken
        as the first baseline. A matching output is then recorded in O(baseline_file) too.
      - Only a key with no baseline on the host nor here is recorded unchecked, and the result's
        C(baseline.note) (and a warning) says so.
      - The role M(ddtree.sglang.sglang_service) passes the file the controller keeps
        (C(sglang_service_fleet_baselines_file)) and adds each host's new baselines to it
        (M(ddtree.sglang.fleet_baselines)).
    type: dict
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
      - Floor for the average acceptance length SGLang reports (C(/server_info), or the C(meta_info) of
        one C(/generate) request on a server that has no average yet); failing when none is reported.
    type: float
  accept_length_from:
    description:
      - C(server_info) - the acceptance length is C(/server_info)'s average since the server started, or
        when it has none, one C(POST /generate) request's C(meta_info) (see the C(performance) stage).
      - C(generate) - always the C(POST /generate) request's, so that two servers are compared on the same
        request (a shadow and its production service, docs/services.md).
    type: str
    choices: [server_info, generate]
    default: server_info
  previous:
    description:
      - The previous release's numbers, C(tokens_per_second) and C(accept_length). Takes precedence
        over O(metrics_file).
    type: dict
  metrics_file:
    description:
      - JSON file on the host with recorded metrics; its last record under the same baseline key is the
        previous release's numbers. O(record_metrics=true) appends the new numbers when every stage passed.
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
  release_id:
    description: The release gated, stored with recorded baselines and metrics and returned for reports.
    type: str
    aliases: [release]
  verdict_file:
    description:
      - JSON file on the host where the verdict (passed or failed, the stage, the failure and the
        measurements) is recorded for O(release_id), written whole right after the verdict, pass or fail.
      - A rollout reads it (M(ddtree.sglang.service_gate_status)) so that a release left by an interrupted
        rollout without a verdict is gated, and a failed one rolled back, on the next run.
    type: path
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
  gate:
    description:
      - The service's gate settings whole, as M(ddtree.sglang.service_plan) returns them (its C(gate)) - each key
        one of O(start_timeout), O(no_progress_timeout), O(min_tokens_per_second), O(min_accept_length),
        O(max_regression), O(baseline_tolerance), O(accept_length_from).
      - A setting there replaces the option's default; an option set to another value than its default wins.
    type: dict
    default: {}
  quick:
    description:
      - The quick stages only (a bake's re-check) - C(unit_watch), C(health), C(chat), C(degenerate); no
        baseline or performance generations, no floors, and nothing recorded (O(baseline_file),
        O(metrics_file) and O(verdict_file) are ignored).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Runs every check (they only read and generate); records nothing, reports C(changed) when it would.
  diff_mode:
    support: none
    description: Recording a baseline, metrics or the verdict is reported in RV(recorded), not as a diff.
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
    verdict_file: /var/lib/sglang/coder/verdicts.json
    min_accept_length: 2.0
    release_id: "{{ release_id }}"
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
died_during:
  description:
    - When the server died after its port answered (then RV(failed_stage) is C(unit_watch)) - the stage
      and the request that failed, its error, and the unit's main PID when the port answered and now.
  returned: when a server died during a later stage
  type: dict
  sample: {stage: baseline, request: "baseline prompt 'List the first ten prime numbers, separated by commas.'",
           error: "ConnectionRefusedError: [Errno 111] Connection refused",
           main_pid_at_ready: "4182", main_pid_now: "0"}
failure_kind:
  description:
    - What failed, for example C(bad_flag), C(oom), C(self_kill), C(scheduler_exception), C(plugin),
      C(unknown_algorithm), C(cuda_oom), C(child_crashed), C(killed), C(restarted), C(no_progress),
      C(start_timeout), C(hung), C(chat), C(degenerate), C(baseline_mismatch), C(performance).
  returned: failure
  type: str
  sample: self_kill
service:
  description: The service gated (I(name)).
  returned: always
  type: str
  sample: coder
release_id:
  description: The release gated (I(release_id)), for reports; null when not given.
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
  sample: {text: "The capital of France is Paris, on the Seine.", completion_tokens: 14, finish_reason: stop, latency_s:
    0.41}
degenerate:
  description: The degenerate-output verdict on the chat text (and which rule fired).
  returned: when reached
  type: dict
  sample: {degenerate: true, rule: one_char, reason: "the output is one character repeated: '!' x 32"}
baseline:
  description:
    - The baseline comparison. C(status) is C(passed), C(failed), C(recorded) (some baselines were new),
      C(missing) (no baseline and not recording), C(skipped) (no O(baseline_file)) or C(incomplete) (a
      request failed before every prompt was generated); C(results) has one entry per prompt generated.
    - C(reference) says what the outputs were compared with - C(host) (O(baseline_file)), C(fleet)
      (O(fleet_baselines), for what the host had none of), C(none) (nothing, so recorded as the first baseline
      of the key, said in C(note)) or C(partial) (some prompts had none); each result has its own
      C(reference), and C(reference_host) and C(reference_release_id) for a fleet entry.
    - C(new_baselines) is a baselines document of what this run records (or would record, in check mode).
  returned: when reached
  type: dict
  sample: {status: passed, file: /var/lib/sglang/coder/baseline.json, model: coder,
           key: "coder | DFLASH | tp 1 | sglang 0.5.23", family: DFLASH,
           results: [{prompt: "List the first ten prime numbers, separated by commas.", status: match, differing_chars:
             0}]}
performance:
  description:
    - Tokens/s, acceptance length, the previous numbers and floors compared with, and the problems found.
    - C(tokens_per_second_rounds) lists each round's tokens/s (two when the first fell short); the faster one
      is C(tokens_per_second).
    - C(accept_length_source) says where the acceptance length came from - C(server_info), C(generate meta_info)
      (one C(/generate) request, described by C(accept_length_request) - prompt, completion_tokens,
      spec_verify_ct, latency_s), or null with C(accept_length_error) saying why it could not be read.
  returned: when reached
  type: dict
  sample: {tokens_per_second: 182.4, accept_length: 12.8, accept_length_source: generate meta_info,
           accept_length_request: {prompt: "List the first ten prime numbers, separated by commas.",
                                   completion_tokens: 64, spec_verify_ct: 5, latency_s: 0.21},
           tokens_per_second_rounds: [182.4], completion_tokens: 192, generation_s: 1.05,
           previous: {tokens_per_second: 175.0, accept_length: 13.4}, problems: []}
recorded:
  description: What was recorded (or, in check mode, would have been); C(verdict) with O(verdict_file).
  returned: always
  type: dict
  sample: {baseline: true, metrics: false, verdict: true}
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

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.gate_options import (
    GATE_OPTIONS,
    POSITIVE,
    argument_spec,
    quick_params,
    with_gate,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.gate_verdicts import utc_now, verdict_record, verdicts_add
from ansible_collections.ddtree.sglang.plugins.module_utils.health_gate import HealthGate, ServiceIO, unit_name
from ansible_collections.ddtree.sglang.plugins.module_utils.health_records import read_json, write_json

# The options: declared once, in module_utils/gate_options.py (tests/unit/test_schemas.py holds DOCUMENTATION,
# the role's per-service settings and docs/health-gate.md to the declaration).
ARGUMENT_SPEC = argument_spec(GATE_OPTIONS)


def record_verdict(module, path, release_id, passed, result):
    """Record the gate's verdict for the release, whole, right after it was reached (not in check mode)."""
    if module.check_mode:
        return
    try:
        document = verdicts_add(read_json(path), release_id, verdict_record(passed, result, utc_now()))
        write_json(path, document, module.atomic_move)
    except (OSError, ValueError) as error:
        module.fail_json(
            msg="the gate's verdict for release %s (%s) could not be recorded in %s: %s"
            % (release_id, "passed" if passed else "failed", path, error),
            **result,
        )


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        required_if=[("record_metrics", True, ("metrics_file",))],
        required_by={"verdict_file": ("release_id",)},
        supports_check_mode=True,
    )
    try:
        params = with_gate(module.params)
    except ValueError as error:
        module.fail_json(msg=str(error))
    if params["quick"]:
        params = quick_params(params)
    for option in POSITIVE:
        if params[option] <= 0:
            module.fail_json(msg="%s must be positive, got %s" % (option, params[option]))
    io = ServiceIO(
        module.run_command,
        module.get_bin_path("systemctl", required=True),
        module.get_bin_path("journalctl", required=True),
        unit_name(params["name"]),
        params["host"],
        params["port"],
        api_key=params["api_key"],
        connect_timeout=max(0.2, min(1.0, params["poll_interval"])),
    )
    gate = HealthGate(
        params,
        io,
        check_mode=module.check_mode,
        warn=module.warn,
        write=lambda path, document: write_json(path, document, module.atomic_move),
    )
    passed, message, result = gate.run()
    if params["verdict_file"]:
        record_verdict(module, params["verdict_file"], params["release_id"], passed, dict(result, msg=message))
        result["recorded"]["verdict"] = True
    if not passed:
        module.fail_json(msg=message, **result)
    module.exit_json(changed=any(result["recorded"].values()), msg=message, **result)


if __name__ == "__main__":
    main()
