#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_autotune
short_description: Choose an SGLang service's DDTREE budget and top-k from measurements, or fall back to DFLASH
version_added: 0.1.0
description:
  - For a service that declares C(speculative.autotune), decides which setting it runs with a candidate
    release - the DDTREE (budget, top_k) of its grid that beats DFLASH by C(min_gain) at every declared
    concurrency and is the fastest of those (best worst-case gain), else DFLASH - and records every
    measurement, the choice and the tuning key in the service's state file.
  - With several declared concurrency levels the choice may be a budget per load - for one top_k, the
    budget measured fastest at each level, as a schedule C(budget) such as C(1:63,16:15,64:7) (the
    overlay verifies each batch size with its range's tree) - when that beats every single budget.
  - Tunes only when the tuning key changed - the model, the drafter, the release, the tensor-parallel
    size or GPU count, the grid and declared load, the measuring workload, or the server's other settings -
    or when O(force) is set. Otherwise it returns the recorded choice and changes nothing, whatever
    O(measurements) holds.
  - Without O(measurements) it only says whether tuning is needed (RV(needs_tuning)) and what to measure
    (RV(grid)); the caller measures and calls it again with the measurements.
  - Never chooses a setting that was not measured at every declared concurrency, or whose measurement
    failed. Fails, leaving the state file as it was, when DFLASH was not measured (or failed) at a declared
    concurrency, or when a measurement is outside the declared grid or given twice.
  - The measuring itself is not part of this module - RV(trials) says what to run, the role starts each
    as a temporary instance on the service's spare GPUs (or, with C(autotune.own_gpus), on its own GPUs and
    port while the service is stopped in the host's rollout window, see RV(own_window)) and
    M(ddtree.sglang.service_autotune_measure) measures it (docs/autotune.md, "Where it measures").
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  service:
    description:
      - The service, as declared in C(sglang_services) (see the sglang_service role). Read are its
        C(name), C(model_path), C(draft_model_path), C(tp_size), C(gpus), C(speculative) (with C(autotune)),
        C(extra_args) and C(environment).
    type: dict
    required: true
  release_id:
    description: The candidate release the measurements were taken with (part of the tuning key).
    type: str
    required: true
  state_file:
    description: The service's tuning state, written whole and atomically (e.g.
      C(/var/lib/sglang/<service>/autotune.json)).
    type: path
    required: true
  base_release_id:
    description: The stack's base release, which a setting that does not load the overlay (DFLASH) runs on.
    type: str
  releases_root:
    description: Where the releases are (e.g. C(/opt/sglang/releases)); given, each of RV(trials) has the C(release_dir)
      it runs from (null otherwise).
    type: path
  history_file:
    description:
      - After a tuning, RV(history) is appended to it as one JSON line (e.g.
        C(/var/lib/sglang/<service>/history.jsonl)); created with mode C(0640) when missing. Not given, none is written.
    type: path
  measurements:
    description:
      - One per setting and concurrency, taken with the candidate release under the declared load. C(tokens_per_second)
        counts every request's completion tokens over the wall time of the whole measurement.
      - A measurement with C(error) set, or without C(tokens_per_second), failed; its setting is never chosen.
      - C(NONE) measurements are optional; when given, the result reports the choice's gain over them.
    type: list
    elements: dict
    default: []
    suboptions:
      algorithm:
        description: The measured algorithm.
        type: str
        required: true
        choices: [DFLASH, DDTREE, NONE]
      budget: {description: DDTREE's budget (DDTREE only), type: int}
      top_k: {description: DDTREE's top-k (DDTREE only), type: int}
      concurrency: {description: Requests in flight at a time, type: int, required: true}
      tokens_per_second: {description: Completion tokens per second of all requests together, type: float}
      accept_length: {description: Mean acceptance length (speculative algorithms), type: float}
      error: {description: "Why the measurement failed (the server did not start, a request failed)", type: str}
      requests: {description: Requests sent (evidence; not used by the choice), type: int}
      completion_tokens: {description: Completion tokens of all requests (evidence), type: int}
      seconds: {description: Wall seconds of the measurement (evidence), type: float}
  workload:
    description:
      - What the measuring step sends (C(max_tokens), C(warmup)); part of the tuning key, so a different workload
        tunes again. The collection's prompt set (its name) and the requests per slot are added to it, so a changed
        prompt set tunes again too.
    type: dict
    default: {}
  floor_margin:
    description:
      - The health gate's speed floor is the chosen setting's tokens/s at concurrency 1 less this share
        (the gate sends one request at a time, with prompts of its own). No floor without concurrency 1.
    type: float
    default: 0.2
  force:
    description: Tune from O(measurements) even when the tuning key did not change.
    type: bool
    default: false
  window:
    description:
      - The result of M(ddtree.sglang.service_autotune_window)'s stop before the trials (its C(serving) is read).
        A service it stopped for its grid, and which was started again, is in RV(window_restarted).
    type: dict
    default: {}
  start_timeout:
    description:
      - Seconds a trial's server may take to answer C(/health) (the measuring step's own limit), unless the service's
        C(health.start_timeout) says otherwise. With C(autotune.own_gpus) it sizes RV(window_restore_after).
    type: float
    default: 900
  window_measure_allowance:
    description:
      - Seconds of measuring allowed per trial beside its start, with C(autotune.own_gpus); sizes
        RV(window_restore_after).
    type: float
    default: 900
attributes:
  check_mode:
    support: full
    description: Decides and returns the choice, but writes no state file.
  diff_mode:
    support: full
    description: The state file before and after.
seealso:
  - module: ddtree.sglang.service_autotune_measure
  - module: ddtree.sglang.service_plan
  - module: ddtree.sglang.sglang_health
"""

EXAMPLES = r"""
- name: Does coder need tuning for this release?
  ddtree.sglang.service_autotune:
    service: "{{ sglang_services | selectattr('name', 'eq', 'coder') | first }}"
    release_id: "{{ release_id }}"
    state_file: /var/lib/sglang/coder/autotune.json
  register: coder_tuning

- name: Decide from the measurements (taken for every entry of coder_tuning.grid)
  ddtree.sglang.service_autotune:
    service: "{{ sglang_services | selectattr('name', 'eq', 'coder') | first }}"
    release_id: "{{ release_id }}"
    state_file: /var/lib/sglang/coder/autotune.json
    measurements:
      - {algorithm: DFLASH, concurrency: 1, tokens_per_second: 140.2, accept_length: 5.1}
      - {algorithm: DDTREE, budget: 8, top_k: 4, concurrency: 1, tokens_per_second: 161.0, accept_length: 6.3}
      - {algorithm: DDTREE, budget: 15, top_k: 4, concurrency: 1, error: "server did not start: CUDA out of memory"}
  when: coder_tuning.needs_tuning
  register: coder_tuned
"""

RETURN = r"""
service:
  description: The service's name (the rollout report files the tuning under it).
  returned: always
  type: str
  sample: coder
window_restarted:
  description:
    - The service's name when its window (O(window)) stopped it while it was serving, so it was started again in this
      run; the health gate judges it even if nothing else changes. Empty otherwise.
  returned: always
  type: list
  elements: str
  sample: [coder]
plan_choice:
  description:
    - The choice to plan the service with now - RV(choice) when the tuning key did not change or the measurements
      decided; otherwise (before measuring, and in check mode) RV(previous_choice), or DFLASH (C(status) C(fallback))
      when the service was never tuned.
  returned: always
  type: dict
  sample: {algorithm: DDTREE, budget: 8, top_k: 4, status: ddtree}
history:
  description: After a tuning (RV(tuned)) - the line the role appends to the service's C(history.jsonl).
  returned: when tuned
  type: dict
msg:
  description: What is tuned and how the service is planned meanwhile, or the tuning's choice.
  returned: always
  type: str
previous_choice:
  description: The choice the state file holds, valid for this key or not (null when there is none); check mode plans
    with it.
  returned: always
  type: dict
  sample: {algorithm: DDTREE, budget: 8, top_k: 4, status: ddtree}
trials:
  description:
    - When tuning is needed and the service declares C(autotune.gpus) and C(autotune.port), or C(autotune.own_gpus) -
      what to run and measure,
      DFLASH first - each with C(label) (C(DDTREE budget 8 top_k 4)), C(setting), C(concurrency), C(start_timeout)
      (the service's C(health.start_timeout), else O(start_timeout)), C(release_dir) (under O(releases_root), the
      candidate for DDTREE, O(base_release_id) for a setting without the overlay) and C(instance), the
      temporary instance's unit entry (name C(<service>-autotune), unit, flags, C(exec_args), environment,
      C(loads_overlay), gpus, port) for the role's unit and environment templates.
  returned: always
  type: list
  elements: dict
  sample: [{label: DFLASH, setting: {algorithm: DFLASH, budget: null, top_k: null}, concurrency: [1],
            instance: {name: coder-autotune, unit: sglang-coder-autotune.service, port: 30100, gpus: [2, 3],
              loads_overlay: false}}]
own_window:
  description:
    - Whether the trials run on the service's own GPUs and port (C(autotune.own_gpus)) - the caller stops the service
      while they run and starts it again afterwards - rather than beside it on spare GPUs.
  returned: always
  type: bool
  sample: false
window_restore_after:
  description:
    - With RV(own_window), when tuning is needed - the seconds after which the host should start the service again by
      itself if the run dies midway (every trial's O(start_timeout) and O(window_measure_allowance), and one more); the
      role arms a timer for it before stopping the service. Null otherwise.
  returned: always
  type: int
  sample: 5400
needs_tuning:
  description: Whether the recorded tuning (if any) is not valid for this key (or O(force) is set).
  returned: always
  type: bool
  sample: true
tuned:
  description: Whether this call decided from O(measurements) (and wrote the state file unless in check mode).
  returned: always
  type: bool
  sample: true
choice:
  description:
    - The setting the service runs - the recorded one when nothing changed, the new one when it tuned; null
      when tuning is needed and no measurements were given.
    - C(status) is C(ddtree) or C(fallback); C(tokens_per_second), C(gain_over_dflash) and C(gain_over_none)
      are per concurrency (keys are strings); C(settings) has every DDTREE setting's verdict (C(qualifies),
      C(too_slow), C(failed), C(unmeasured)) and reasons; C(speed_floor) is the gate's tokens/s floor.
  returned: always
  type: dict
  sample:
    algorithm: DDTREE
    budget: 8
    top_k: 4
    status: ddtree
    reason: DDTREE budget 8 top_k 4 is the fastest setting that beats DFLASH by min_gain +3.0% at every declared
      concurrency (+14.8% at concurrency 1)
    tokens_per_second: {"1": 161.0}
    gain_over_dflash: {"1": 0.1484}
    gain_over_none: {}
    speed_floor: 128.8
    floor_margin: 0.2
measurements:
  description: The measurements this call decided from, as given (the rollout report charts them).
  returned: when RV(tuned)
  type: list
  elements: dict
key:
  description: The tuning key - C(digest) and the C(parts) it is computed from.
  returned: always
  type: dict
  sample: {digest: 3f2a9c0d11e4b7a2, parts: {model: /models/coder, drafter: /models/coder-dflash, release_id:
    4c1d2e3f4a5b}}
key_changes:
  description: The key's parts that differ from the recorded tuning's (all of them when there was none).
  returned: always
  type: list
  elements: str
  sample: [release_id]
grid:
  description: What to measure - every candidate setting (DFLASH first) at every declared concurrency.
  returned: always
  type: list
  elements: dict
  sample: [{algorithm: DFLASH, budget: null, top_k: null, concurrency: 1}, {algorithm: DDTREE, budget: 4, top_k: 4,
    concurrency: 1}]
problems:
  description: Why the measurements could not decide (on failure).
  returned: failure
  type: list
  elements: str
  sample: ["DFLASH was not measured at concurrency 16; every DDTREE setting is compared with it"]
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.autotune import (
    DEFAULT_FLOOR_MARGIN,
    IncompleteMeasurements,
    autotune_problems,
    choose,
    declaration,
    declared,
    in_own_window,
    key_changes,
    measurement_plan,
    recorded_choice,
    state_document,
    tuning_key,
    tuning_record,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.autotune_measure import PROMPT_SET, ROUNDS
from ansible_collections.ddtree.sglang.plugins.module_utils.autotune_trials import (
    trial_release_id,
    trial_start_timeout,
    trials,
    window_restarted,
    window_restore_after,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.gate_options import default as gate_default
from ansible_collections.ddtree.sglang.plugins.module_utils.health_records import (
    append_json_line,
    read_json,
    write_json,
)

ARGUMENT_SPEC = dict(
    service=dict(type="dict", required=True),
    release_id=dict(type="str", required=True),
    state_file=dict(type="path", required=True),
    history_file=dict(type="path"),
    base_release_id=dict(type="str"),
    releases_root=dict(type="path"),
    measurements=dict(
        type="list",
        elements="dict",
        default=[],
        options=dict(
            algorithm=dict(type="str", required=True, choices=["DFLASH", "DDTREE", "NONE"]),
            budget=dict(type="int"),
            top_k=dict(type="int"),
            concurrency=dict(type="int", required=True),
            tokens_per_second=dict(type="float", no_log=False),
            accept_length=dict(type="float"),
            error=dict(type="str"),
            requests=dict(type="int"),
            completion_tokens=dict(type="int", no_log=False),
            seconds=dict(type="float"),
        ),
    ),
    workload=dict(type="dict", default={}),
    floor_margin=dict(type="float", default=DEFAULT_FLOOR_MARGIN),
    force=dict(type="bool", default=False),
    start_timeout=dict(type="float", default=gate_default("start_timeout")),
    window_measure_allowance=dict(type="float", default=900.0),
    window=dict(type="dict", default={}),
)


def _text(document):
    return "" if document is None else json.dumps(document, indent=2, sort_keys=True) + "\n"


# Before measuring (and in check mode, which measures nothing) a service that needs tuning is planned with the
# choice tuned before, or DFLASH, the fallback, when it was never tuned.
FALLBACK = {"algorithm": "DFLASH", "status": "fallback", "reason": "not tuned yet (check mode measures nothing)"}
# The choice's fields a history line keeps.
HISTORY_FIELDS = (
    "algorithm",
    "budget",
    "top_k",
    "status",
    "reason",
    "tokens_per_second",
    "gain_over_dflash",
    "gain_over_none",
    "speed_floor",
)


def plan_choice(result: dict) -> dict:
    """The choice to plan the service with now: the recorded one when its key holds, else the provisional one."""
    if not result["needs_tuning"] and result["choice"]:
        return result["choice"]
    return result["previous_choice"] or dict(FALLBACK)


def tuning_message(name: str, result: dict) -> str:
    """What is tuned and how the service is planned meanwhile (check mode says it and measures nothing)."""
    if not result["needs_tuning"]:
        return "%s: the tuning key did not change; planned with %s" % (name, _setting(result["plan_choice"]))
    trials_ = result["trials"]
    where = ""
    if trials_:
        where = " at concurrency %s, each on a temporary instance on GPUs %s" % (
            ", ".join(str(c) for c in trials_[0]["concurrency"]),
            ", ".join(str(g) for g in trials_[0]["instance"]["gpus"]),
        )
    if result["own_window"]:
        where += " (its own: the service stops for up to %s s)" % result["window_restore_after"]
    return "%s would be tuned (%s changed): %s%s; planned meanwhile with %s (%s)" % (
        name,
        ", ".join(result["key_changes"]),
        ", ".join(trial["label"] for trial in trials_),
        where,
        _setting(result["plan_choice"]),
        "the choice tuned before" if result["previous_choice"] else "no tuning yet: the fallback",
    )


def _setting(choice: dict) -> str:
    if choice.get("algorithm") == "DDTREE":
        return "DDTREE budget %s top_k %s" % (choice.get("budget"), choice.get("top_k"))
    return str(choice.get("algorithm"))


def history_record(choice: dict, result: dict, release_id: str) -> dict:
    """The line the role appends to the service's history.jsonl after a tuning."""
    return {
        "time": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "event": "autotune",
        "release_id": release_id,
        "key": result["key"]["digest"],
        "key_changes": result["key_changes"],
        "choice": {key: choice[key] for key in HISTORY_FIELDS if key in choice},
        "settings": [setting.get("status") for setting in choice.get("settings") or []],
        "state_file": "autotune.json",
    }


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    service, path = params["service"], params["state_file"]
    name = service.get("name", "service")
    _check_declaration(module, service, name)
    tuning = declaration(service["speculative"])
    # The prompt set is the collection's: its name (bumped with its text) keys the tuning too.
    key = tuning_key(
        service, params["release_id"], dict({"prompts": PROMPT_SET, "rounds": ROUNDS}, **params["workload"])
    )
    try:
        document = read_json(path)
    except (OSError, ValueError) as exc:
        module.fail_json(msg="%s: cannot read the tuning state %s (%s); move it aside to tune anew" % (name, path, exc))
    result = _decision(module, service, name, key, tuning, document)
    if not result["needs_tuning"]:
        if params["measurements"]:
            module.warn(
                "%s: the tuning key %s did not change since %s: the measurements were not used (force: true "
                "tunes from them)" % (name, key["digest"], document["current"].get("tuned_at"))
            )
        module.exit_json(**result)
    if not params["measurements"]:
        result["choice"] = None
        module.exit_json(**result)
    _tune(module, result, name, key, tuning, document)
    module.exit_json(**result)


def _check_declaration(module, service: dict, name: str):
    """Fail unless the service declares a valid autotune, and the floor margin is a share."""
    params = module.params
    if not declared(service):
        module.fail_json(
            msg="%s: speculative.autotune is not declared; only a DDTREE service with autotune is tuned" % name
        )
    problems = autotune_problems(service.get("speculative") or {})
    if problems:
        module.fail_json(msg="%s: %s" % (name, " | ".join(problems)), problems=problems)
    if not 0 <= params["floor_margin"] < 1:
        module.fail_json(msg="floor_margin is %s; it must be from 0 up to, not including, 1" % params["floor_margin"])


def _decision(module, service: dict, name: str, key: dict, tuning: dict, document) -> dict:
    """Whether the service needs tuning for this key, with the choice recorded before, and the trials to run."""
    params = module.params
    recorded = recorded_choice(document, key)
    current = (document or {}).get("current") or {}
    result = dict(
        changed=False,
        tuned=False,
        needs_tuning=recorded is None or params["force"],
        choice=recorded,
        key=key,
        key_changes=key_changes(current.get("key"), key),
        grid=measurement_plan(tuning),
        service=name,
        previous_choice=current.get("choice"),
        trials=[],
        window_restarted=window_restarted(name, params["window"]),
    )
    own = service["speculative"]["autotune"]
    result["own_window"] = in_own_window(service)
    result["window_restore_after"] = None
    if result["needs_tuning"] and (result["own_window"] or own.get("gpus") is not None and own.get("port") is not None):
        _add_trials(module, service, name, result)
    result["plan_choice"] = plan_choice(result)
    result["msg"] = tuning_message(name, result)
    return result


def _add_trials(module, service: dict, name: str, result: dict):
    """The trials to measure (each with its start timeout and release), and the window's restore delay."""
    params = module.params
    start_timeout = trial_start_timeout(service, params["start_timeout"])
    try:
        result["trials"] = [
            dict(
                trial,
                start_timeout=start_timeout,
                release_dir=params["releases_root"]
                and os.path.join(
                    params["releases_root"],
                    trial_release_id(trial, params["release_id"], params["base_release_id"]),
                ),
            )
            for trial in trials(service)
        ]
        if result["own_window"]:
            result["window_restore_after"] = window_restore_after(
                len(result["trials"]), start_timeout, params["window_measure_allowance"]
            )
    except ValueError as exc:
        module.fail_json(msg="%s: %s" % (name, exc))


def _tune(module, result: dict, name: str, key: dict, tuning: dict, document):
    """Choose from the measurements, and record the choice in the state file and the history."""
    params = module.params
    path = params["state_file"]
    try:
        choice = choose(tuning, params["measurements"])
    except IncompleteMeasurements as exc:
        module.fail_json(
            **dict(
                result,
                msg="%s: the measurements cannot decide, the state file was left as it was: %s" % (name, exc),
                problems=exc.problems,
            )
        )
    record = tuning_record(
        key,
        params["release_id"],
        tuning,
        params["measurements"],
        choice,
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        params["floor_margin"],
    )
    after = state_document(document, record)
    result.update(
        changed=True,
        tuned=True,
        choice=record["choice"],
        plan_choice=record["choice"],
        history=history_record(record["choice"], result, params["release_id"]),
        measurements=record["measurements"],
    )
    result["msg"] = "%s: %s" % (name, record["choice"].get("reason") or "")
    if module._diff:
        result["diff"] = {
            "before": _text(document),
            "after": _text(after),
            "before_header": "%s (before)" % path,
            "after_header": "%s (after)" % path,
        }
    if not module.check_mode:
        _write_records(module, result, name, after)


def _write_records(module, result: dict, name: str, after: dict):
    params = module.params
    try:
        write_json(params["state_file"], after, module.atomic_move)
    except OSError as exc:
        module.fail_json(
            **dict(result, msg="%s: cannot write the tuning state %s: %s" % (name, params["state_file"], exc))
        )
    if params["history_file"]:
        try:
            append_json_line(params["history_file"], result["history"])
        except OSError as exc:
            module.fail_json(
                **dict(result, msg="%s: cannot append to the history %s: %s" % (name, params["history_file"], exc))
            )


if __name__ == "__main__":
    main()
