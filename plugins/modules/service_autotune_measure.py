#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_autotune_measure
short_description: Measure one setting of a tuned SGLang service on its running temporary instance
version_added: 0.1.0
description:
  - Waits until the server of one candidate setting (DFLASH, or a DDTREE budget and top-k) answers
    C(GET /health), then sends the collection's fixed prompt set greedily to its native C(/generate) at
    each declared concurrency, and returns the measurements M(ddtree.sglang.service_autotune) decides from.
  - A setting whose server exits at start, is not ready within O(start_timeout), or fails a request is
    returned as failed measurements (C(error) set), not as a failed task, so it is never chosen and the
    other settings are still measured. M(ddtree.sglang.service_autotune) fails when DFLASH failed.
  - The role starts each setting as a temporary instance on the service's spare GPUs and removes it
    afterwards (docs/autotune.md, "Where it measures").
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  unit:
    description: The temporary instance's systemd unit; watched while the server starts, so one that exits is not waited
      for.
    type: str
    required: true
  host:
    description: The address the instance listens on (a wildcard address is reached through loopback).
    type: str
    default: 127.0.0.1
  port:
    description: The instance's port.
    type: int
    required: true
  api_key:
    description: The service's API key, when it has one.
    type: str
  setting:
    description: The setting the instance runs, as M(ddtree.sglang.service_autotune) returns it in C(trials).
    type: dict
    required: true
    suboptions:
      algorithm: {description: "DFLASH or DDTREE (or NONE: reported, never chosen)", type: str, required: true, choices:
        [DFLASH, DDTREE, NONE]}
      budget: {description: DDTREE's budget, type: int}
      top_k: {description: DDTREE's top-k, type: int}
  concurrency:
    description: The declared concurrencies; each is measured, lowest first.
    type: list
    elements: int
    required: true
  start_timeout:
    description: Seconds to wait for the server to answer C(GET /health) with 200.
    type: float
    default: 900
extends_documentation_fragment:
  - ddtree.sglang.attributes.read_only
  - ddtree.sglang.autotune_workload
seealso:
  - module: ddtree.sglang.service_autotune
"""

EXAMPLES = r"""
- name: Measure DDTREE budget 8 top_k 4 on coder's temporary instance
  ddtree.sglang.service_autotune_measure:
    unit: sglang-coder-autotune.service
    port: 30100
    setting: {algorithm: DDTREE, budget: 8, top_k: 4}
    concurrency: [1, 16]
  register: coder_b8
"""

RETURN = r"""
measurements:
  description:
    - One per declared concurrency, in the shape M(ddtree.sglang.service_autotune) takes - the setting,
      C(concurrency), C(tokens_per_second) (all completion tokens over the level's wall seconds),
      C(accept_length), C(error) (null when it was measured), and the evidence C(requests),
      C(completion_tokens), C(seconds).
  returned: always
  type: list
  elements: dict
  sample: [{algorithm: DDTREE, budget: 8, top_k: 4, concurrency: 1, tokens_per_second: 161.0, accept_length: 6.3,
            error: null, requests: 8, completion_tokens: 1024, seconds: 6.36}]
ready_s:
  description: Seconds from the call until the server answered C(GET /health) with 200 (null when it never did).
  returned: always
  type: float
  sample: 41.2
workload:
  description: What was sent (prompt set name, C(max_tokens), C(warmup), rounds per slot), as the tuning key records it.
  returned: always
  type: dict
  sample: {prompts: autotune-v1, max_tokens: 128, warmup: 1, rounds: 2}
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.autotune_measure import (
    SETTING_OPTIONS,
    WORKLOAD_ARGUMENT_SPEC,
    measure_instance,
    workload,
    workload_problem,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.gate_options import default as gate_default
from ansible_collections.ddtree.sglang.plugins.module_utils.health_gate import ServiceIO


def main():
    module = AnsibleModule(
        argument_spec=dict(
            unit=dict(type="str", required=True),
            host=dict(type="str", default="127.0.0.1"),
            port=dict(type="int", required=True),
            api_key=dict(type="str", no_log=True),
            setting=dict(type="dict", required=True, options=SETTING_OPTIONS),
            concurrency=dict(type="list", elements="int", required=True),
            start_timeout=dict(type="float", default=gate_default("start_timeout")),
            **WORKLOAD_ARGUMENT_SPEC,
        ),
        # It only reads (requests to a server); the role starts no temporary instance in check mode.
        supports_check_mode=True,
    )
    params = module.params
    problem = workload_problem(params)
    if problem:
        module.fail_json(msg=problem)
    systemctl = module.get_bin_path("systemctl", required=True)
    io = ServiceIO(
        module.run_command,
        systemctl,
        module.get_bin_path("journalctl", required=True),
        params["unit"],
        params["host"],
        params["port"],
        api_key=params["api_key"],
    )

    def unit_state():
        _rc, out, _err = module.run_command([systemctl, "is-active", params["unit"]])
        return out.strip()

    setting = {key: params["setting"][key] for key in ("algorithm", "budget", "top_k")}
    measured = measure_instance(
        io.request,
        unit_state,
        setting,
        params["concurrency"],
        params["max_tokens"],
        params["warmup"],
        params["start_timeout"],
        params["request_timeout"],
    )
    module.exit_json(
        changed=False,
        measurements=measured["measurements"],
        ready_s=measured["ready_s"],
        workload=workload(params["max_tokens"], params["warmup"]),
    )


if __name__ == "__main__":
    main()
