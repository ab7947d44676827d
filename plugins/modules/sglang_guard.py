#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_guard
short_description: Watch a deployed DDTREE service and say whether to fall back to DFLASH
version_added: 0.3.0
description:
  - Runs on the GPU host after a rollout, on a schedule (C(playbooks/watch.yml), an AWX schedule or a timer).
    Over C(guard.window) seconds (O(guard)) it sends C(guard.probe_requests) greedy C(POST /generate)
    requests (the tuning's prompts), spread over the window, and reads C(/server_info) and C(/metrics) (when
    the server exposes it).
  - It compares what it saw with what was recorded on this host - DFLASH's tokens/s and acceptance at the
    nearest load from the tuning (O(state_dir)C(/autotune.json)), and the acceptance this release's health
    gate recorded (O(state_dir)C(/metrics.json)) - and decides (C(plugins/module_utils/guard.py)).
  - RV(action) C(switch) - DDTREE's per-request tokens/s fell below DFLASH's by more than C(guard.margin), or
    its acceptance collapsed below C(guard.collapse_ratio) of the recorded one; C(hold) - it would switch, but
    the guard switched this service less than C(guard.hold_down) seconds ago (O(state_dir)C(/guard.json));
    C(keep) - DDTREE holds up, or the service does not run DDTREE (the guard never switches back);
    C(unknown) - the live numbers could not be read, so nothing changes, and RV(reasons) says why.
  - The module changes nothing itself; the watch playbook switches a service whose RV(action) is C(switch)
    through the service role and its health gate, then writes RV(state) and appends RV(record) to the
    service's C(history.jsonl).
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  name:
    description: The service's name (its entry in C(sglang_services)); the unit is C(sglang-<name>.service).
    type: str
    required: true
  host:
    description: Address the service listens on (C(0.0.0.0) and C(::) are reached through C(127.0.0.1)).
    type: str
    default: 127.0.0.1
  port:
    description: Port the service listens on.
    type: int
    required: true
  api_key:
    description:
      - "The service's API key, sent as C(Authorization: Bearer) to C(/server_info) and C(/generate). Never returned."
    type: str
  speculative:
    description:
      - The service's declared C(speculative) settings. A service that does not declare DDTREE is answered with
        RV(watched) false and nothing is measured.
    type: dict
    default: {}
  guard:
    description:
      - The service's C(guard) settings (C(window), C(probe_requests), C(max_tokens), C(margin), C(collapse_ratio),
        C(hold_down), C(fallback), C(enabled)), declared in C(plugins/module_utils/guard.py); unset ones take
        their defaults there (docs/guard.md).
    type: dict
    default: {}
  state_dir:
    description: The service's state directory (C(autotune.json), C(metrics.json), C(guard.json)).
    type: path
    required: true
  services_root:
    description: Where the services' C(current) links are (the release the service runs is read from its link).
    type: path
    default: /opt/sglang/services
  request_timeout:
    description: Seconds one request may take.
    type: float
    default: 60
extends_documentation_fragment:
  - ddtree.sglang.attributes.read_only
seealso:
  - module: ddtree.sglang.sglang_health
  - module: ddtree.sglang.service_autotune
"""

EXAMPLES = r"""
- name: Watch coder
  ddtree.sglang.sglang_guard:
    name: coder
    port: 30000
    api_key: "{{ vault_coder_api_key }}"
    speculative: {algorithm: DDTREE, budget: 15, top_k: 8}
    guard: {window: 60, hold_down: 3600}
    state_dir: /var/lib/sglang/coder
  register: coder_guard

- name: Say what the guard decided
  ansible.builtin.debug:
    msg: "{{ coder_guard.action }}: {{ coder_guard.reasons | join('; ') }}"
"""

RETURN = r"""
watched:
  description: Whether the guard watches this service (DDTREE, C(guard.enabled)).
  returned: always
  type: bool
action:
  description: C(switch), C(hold), C(keep) or C(unknown) (see the description); C(keep) for a service not watched.
  returned: always
  type: str
  sample: switch
switch:
  description: Whether RV(action) is C(switch).
  returned: always
  type: bool
reasons:
  description: Why, with the numbers.
  returned: always
  type: list
  elements: str
  sample: ["acceptance length 1.02 (probe) collapsed below 50% of the 2.61 this release's gate recorded (1.30)"]
live:
  description: What the guard saw - C(algorithm), C(tokens_per_second) (per request), C(accept_length) and its source,
    C(server_info_accept_length), C(metrics_accept_length), C(gen_throughput), C(running_requests), C(load).
  returned: when watched and reachable
  type: dict
probe:
  description: The probe's requests, failures, tokens/s and acceptance, and up to three errors.
  returned: when watched
  type: dict
recorded:
  description:
    - C(dflash) (autotune.json's DFLASH at the nearest load) and C(release) (the gate's numbers for this release).
  returned: when watched
  type: dict
unit_algorithm:
  description:
    - The speculative algorithm the unit's flags name (C(systemctl show -p ExecStart)); SGLang's C(/server_info) says
      C(DFLASH) for a DDTREE server too (the overlay resolves DDTREE as DFLASH with its own worker).
  returned: when watched
  type: str
release_id:
  description: The release the service's C(current) link names.
  returned: when watched
  type: str
state:
  description: The service's C(guard.json) after the switch (the hold-down counts from C(last_switch.epoch)).
  returned: when RV(action) is C(switch)
  type: dict
record:
  description: The line for the service's C(history.jsonl) (C(event) C(guard)).
  returned: when RV(action) is C(switch)
  type: dict
"""

import http.client
import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.autotune_measure import PROMPTS
from ansible_collections.ddtree.sglang.plugins.module_utils.guard import (
    decide,
    declared_speculative,
    dflash_reference,
    guard_settings,
    guard_state,
    history_record,
    live_numbers,
    parse_metrics,
    release_reference,
    summarize_probe,
    unit_algorithm,
    watched,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.health_gate import (
    ServiceIO,
    connect_host,
    describe,
    unit_name,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.health_records import read_json


def probe(io, settings: dict, timeout: float, sleep=time.sleep) -> list:
    """settings['probe_requests'] greedy /generate requests spread over settings['window'] seconds."""
    count = settings["probe_requests"]
    pause = settings["window"] / count if count > 1 else 0
    replies = []
    for index in range(count):
        if index:
            sleep(pause)
        body = {
            "text": PROMPTS[index % len(PROMPTS)],
            "sampling_params": {"max_new_tokens": settings["max_tokens"], "temperature": 0},
        }
        answer = io.request("POST", "/generate", body, timeout=timeout, auth=True)
        meta = answer["data"].get("meta_info") if answer["status"] == 200 and isinstance(answer["data"], dict) else None
        if not isinstance(meta, dict):
            replies.append({"error": describe(answer)})
            continue
        replies.append(
            {
                "completion_tokens": meta.get("completion_tokens"),
                "seconds": answer["seconds"],
                "accept_length": meta.get("spec_accept_length"),
                "verify_steps": meta.get("spec_verify_ct"),
            }
        )
    return replies


def fetch_metrics(host: str, port: int, timeout: float):
    """/metrics' text whole (ServiceIO.request keeps only the start of a body), or None when the server does
    not expose it (SGLang without --enable-metrics answers 404) or did not answer."""
    connection = http.client.HTTPConnection(connect_host(host), port, timeout=timeout)
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        text = response.read().decode("utf-8", "replace")
        return text if response.status == 200 else None
    except Exception:  # http.client's and socket's errors alike: no metrics, said in the result
        return None
    finally:
        connection.close()


def read_state(module, path: str):
    try:
        return read_json(path)
    except (OSError, ValueError) as exc:
        module.warn("cannot read %s (%s): read as empty" % (path, exc))
        return None


def _watch(module, service: dict, settings: dict) -> tuple:
    """One watch of the service: /server_info, /metrics, the probe's greedy requests, the unit's algorithm.
    -> (its live numbers or None, the probe's summary, the metrics or None, the algorithm, why it was unreachable)."""
    name = service["name"]
    timeout = module.params["request_timeout"]
    io = ServiceIO(
        module.run_command,
        module.get_bin_path("systemctl") or "systemctl",
        module.get_bin_path("journalctl") or "journalctl",
        unit_name(name),
        service.get("host") or "127.0.0.1",
        int(service["port"]),
        api_key=service.get("api_key"),
    )
    info = io.request("GET", "/server_info", timeout=timeout, auth=True)
    unreachable = (
        None if info["status"] == 200 and isinstance(info["data"], dict) else "GET /server_info: %s" % describe(info)
    )
    metrics_text = fetch_metrics(service.get("host") or "127.0.0.1", int(service["port"]), timeout)
    metrics = parse_metrics(metrics_text) if metrics_text is not None else None
    probe_summary = {"requests": 0}
    if unreachable is None:
        probe_summary = summarize_probe(probe(io, settings, timeout))
        if probe_summary["failed"] == probe_summary["requests"]:
            unreachable = "every probe request failed: %s" % "; ".join(probe_summary["errors"])
    systemctl = module.get_bin_path("systemctl")
    algorithm = None
    if systemctl:
        rc, exec_start, _err = module.run_command([systemctl, "show", "-p", "ExecStart", "--value", unit_name(name)])
        algorithm = unit_algorithm(exec_start) if rc == 0 else None
    live = None if unreachable else live_numbers(info["data"], metrics, probe_summary, algorithm)
    return live, probe_summary, metrics, algorithm, unreachable


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            host=dict(type="str", default="127.0.0.1"),
            port=dict(type="int", required=True),
            api_key=dict(type="str", no_log=True),
            speculative=dict(type="dict", default={}),
            guard=dict(type="dict", default={}),
            state_dir=dict(type="path", required=True),
            services_root=dict(type="path", default="/opt/sglang/services"),
            request_timeout=dict(type="float", default=60.0),
        ),
        supports_check_mode=True,
    )
    service = {key: module.params[key] for key in ("name", "host", "port", "api_key", "speculative", "guard")}
    name = service["name"]
    if not watched(service):
        module.exit_json(
            changed=False,
            watched=False,
            action="keep",
            switch=False,
            reasons=["%s is not a watched DDTREE service" % name],
        )
    settings = guard_settings(service)
    state_dir = module.params["state_dir"]
    current = os.path.join(module.params["services_root"], name, "current")
    release_id = os.path.basename(os.path.realpath(current)) if os.path.islink(current) else None
    live, probe_summary, metrics, algorithm, unreachable = _watch(module, service, settings)
    recorded = {
        "dflash": dflash_reference(
            read_state(module, os.path.join(state_dir, "autotune.json")), (live or {}).get("load", 1)
        ),
        "release": release_reference(read_state(module, os.path.join(state_dir, "metrics.json")), release_id),
    }
    previous = read_state(module, os.path.join(state_dir, "guard.json"))
    now = time.time()
    decision = decide(settings, live, recorded["dflash"], recorded["release"], previous, now, unreachable)
    result = dict(
        changed=False,
        watched=True,
        action=decision["action"],
        switch=decision["action"] == "switch",
        reasons=decision["reasons"],
        probe=probe_summary,
        recorded=recorded,
        release_id=release_id,
        metrics_exposed=metrics is not None,
        unit_algorithm=algorithm,
    )
    if live is not None:
        result["live"] = live
    if decision["action"] == "switch":
        result["state"] = guard_state(previous, decision, live, now, release_id, declared_speculative(service))
        result["record"] = history_record(name, decision, live, recorded, release_id, now)
    if decision["action"] == "unknown":
        module.warn("%s: %s" % (name, decision["reasons"][0]))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
