#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_shadow_compare
short_description: Decide whether a shadow's candidate release is promoted to its production service
version_added: 0.1.0
description:
  - A shadow service (C(shadow_of)) runs the rollout's candidate first, beside its production service
    (docs/services.md, "Shadow services"). This module compares the shadow's health gate
    (M(ddtree.sglang.sglang_health) after the deploy) with the same gate run on the production service as
    it runs, recording nothing, and says C(promoted) or C(held).
  - C(promoted) only when the shadow's gate passed, and on the gate's prompts its greedy outputs equal
    production's, its tokens/s is not lower than production's by more than O(max_slowdown), and its
    acceptance length is not lower than production's.
  - C(held) otherwise, naming every reason and the numbers; the role then rolls the shadow back and
    leaves the production service as it is. The rules are in C(plugins/module_utils/shadows.py).
  - Changes nothing.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  production:
    description: The production service's name.
    type: str
    required: true
  shadow:
    description: The shadow service's name.
    type: str
    required: true
  shadow_gate:
    description: The shadow's gate result on the candidate (sglang_health's result); empty when it was not gated.
    type: dict
    default: {}
  production_gate:
    description: The gate's result on the production service, run recording nothing (check mode), for its outputs and
      numbers.
    type: dict
    default: {}
  max_slowdown:
    description: The largest share of production's tokens/s the shadow may lose (C(0.1) - at least 90%).
    type: float
    default: 0.1
extends_documentation_fragment:
  - ddtree.sglang.attributes.read_only
seealso:
  - module: ddtree.sglang.sglang_health
  - module: ddtree.sglang.service_release_choice
"""

EXAMPLES = r"""
- name: Compare the shadow's candidate with production
  ddtree.sglang.service_shadow_compare:
    production: coder
    shadow: coder-shadow
    shadow_gate: "{{ shadow_gate }}"
    production_gate: "{{ production_measure }}"
    max_slowdown: 0.1
  register: comparison

- name: Promote the candidate to coder only when the shadow was not worse
  ddtree.sglang.service_link:
    service: coder
    release_id: "{{ shadow_gate.release_id }}"
  when: comparison.promote
"""

RETURN = r"""
verdict:
  description: C(promoted) (the production service may take the candidate) or C(held) (it keeps its release).
  returned: always
  type: str
  sample: held
promote:
  description: Whether the verdict is C(promoted).
  returned: always
  type: bool
problems:
  description: Why the candidate is held; empty when promoted.
  returned: always
  type: list
  elements: str
  sample: ["the greedy output for prompt 'List the first ten prime numbers, separated by commas.' differs from
    production's after character 12: ..."]
shadow:
  description: The shadow's release, whether its gate passed (and its stage), tokens/s and acceptance length.
  returned: always
  type: dict
  sample: {release_id: 9c1d0b7e3f2a, passed: true, stage: performance, tokens_per_second: 182.4, accept_length: 4.1}
production:
  description: The same numbers for the production service.
  returned: always
  type: dict
  sample: {release_id: 0b7e3f2a9c1d, passed: true, stage: performance, tokens_per_second: 175.0, accept_length: 4.1}
outputs_compared:
  description: How many greedy outputs were compared.
  returned: always
  type: int
max_slowdown:
  description: O(max_slowdown).
  returned: always
  type: float
service:
  description: The production service (O(production)), for reports.
  returned: always
  type: str
shadow_service:
  description: The shadow service (O(shadow)).
  returned: always
  type: str
msg:
  description: One line - the verdict, the numbers and the reasons.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.shadows import shadow_verdict


def main():
    module = AnsibleModule(
        argument_spec=dict(
            production=dict(type="str", required=True),
            shadow=dict(type="str", required=True),
            shadow_gate=dict(type="dict", default={}),
            production_gate=dict(type="dict", default={}),
            max_slowdown=dict(type="float", default=0.1),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if not 0 <= params["max_slowdown"] < 1:
        module.fail_json(
            msg="max_slowdown is %g; it is a share of production's tokens/s, at least 0 and below 1"
            % params["max_slowdown"]
        )
    result = shadow_verdict(params["shadow_gate"], params["production_gate"], params["max_slowdown"])
    shadow, production = result["shadow"], result["production"]
    numbers = "tokens/s %s vs %s, acceptance %s vs %s, %d output(s) compared" % (
        shadow["tokens_per_second"],
        production["tokens_per_second"],
        shadow["accept_length"],
        production["accept_length"],
        result["outputs_compared"],
    )
    msg = "%s: shadow %s on %s, production %s on %s (%s)" % (
        result["verdict"],
        params["shadow"],
        shadow["release_id"],
        params["production"],
        production["release_id"],
        numbers,
    )
    if result["problems"]:
        msg += ": " + "; ".join(result["problems"])
    module.exit_json(changed=False, service=params["production"], shadow_service=params["shadow"], msg=msg, **result)


if __name__ == "__main__":
    main()
