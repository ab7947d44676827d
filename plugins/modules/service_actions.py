#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_actions
short_description: Decide per SGLang service what to restart, gate, quick-check, roll back or promote
version_added: 0.2.0
description:
  - The sglang_service role's decisions after the switch, with the reason for each; the role only acts on them.
  - C(restart) - the service's unit, environment or API key changed, the launcher changed, its release was
    switched to, or its release has no passed verdict and the process may predate it
    (M(ddtree.sglang.service_gate_status)).
  - C(start) - every service not rolled back is kept running; C(gate) - each one restarted, started because it
    was not running, stopped and started for its tuning, or whose release has no verdict; C(quick_check) - the
    others (a C(/health) request).
  - C(rollback) - a release whose recorded verdict failed (and that was not switched away from in this run);
    after the gates (O(gate_results)) also each failed gate of this run and each shadow whose candidate was held.
  - C(promote) - after the gates, each production service whose shadow passed and was not worse, when no
    service of the host is rolled back.
  - In check mode a service whose unit is not installed yet is neither restarted nor started, and nothing is
    gated or quick-checked (RV(services) still says what would be).
  - The rules are plain functions in C(plugins/module_utils/service_actions.py).
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  services:
    description: The plan's services (M(ddtree.sglang.service_plan)'s RV(ddtree.sglang.service_plan#module:services)).
    type: list
    elements: dict
    required: true
  releases:
    description: Per service, its release choice (M(ddtree.sglang.service_release_choice)'s C(services)).
    type: dict
    default: {}
  links:
    description: The names of the services whose current link changed, or the registered M(ddtree.sglang.service_link)
      loop's results.
    type: list
    elements: raw
    default: []
  changed:
    description:
      - What changed on the host in this run - C(units), C(environments), C(api_keys) (each a list of names,
        or a registered loop's results whose items are plan entries), C(files) (the registered
        M(ddtree.sglang.service_files) loop's results, whose C(changes) name the files) and C(launcher) (a boolean).
    type: dict
    default: {}
  recorded:
    description: The recorded gate verdicts' actions (M(ddtree.sglang.service_gate_status)'s C(services)).
    type: dict
    default: {}
  window_restarted:
    description: The services a tuning stopped and started again in this run.
    type: list
    elements: str
    default: []
  gate_results:
    description:
      - After the gates - this run's M(ddtree.sglang.sglang_health) results, each with its plan entry as C(item).
        Given, the result also says what to roll back and promote.
    type: list
    elements: dict
  shadow_verdicts:
    description: After the gates - per production service, M(ddtree.sglang.service_shadow_compare)'s result.
    type: dict
    default: {}
  units_dir:
    description: Where the units are installed (read in check mode only).
    type: path
    default: /etc/systemd/system
  host:
    description: The host's name, for the failure message.
    type: str
    default: host
  state_root:
    description: Where services' state lives, for the failure message (each rollback's history).
    type: path
    default: /var/lib/sglang
extends_documentation_fragment:
  - ddtree.sglang.attributes.read_only
seealso:
  - module: ddtree.sglang.service_gate_status
  - module: ddtree.sglang.sglang_health
"""

EXAMPLES = r"""
- name: Decide what to restart, gate and quick-check
  ddtree.sglang.service_actions:
    services: "{{ plan.services }}"
    releases: "{{ releases.services }}"
    links: "{{ links.results }}"
    changed:
      units: "{{ units.results }}"
      launcher: false
    recorded: "{{ gate_status.services }}"
  register: actions

- name: Restart what changed
  ansible.builtin.systemd_service:
    name: "{{ item.unit }}"
    state: restarted
  loop: "{{ actions.restart }}"
"""

RETURN = r"""
services:
  description: Per service - C(restart), C(start), C(gate), C(quick_check), C(rollback), C(promote) and the C(reasons).
  returned: always
  type: dict
  sample:
    coder: {restart: true, start: true, gate: true, quick_check: false, rollback: false, promote: false,
            reasons: [release switched], unit: sglang-coder.service, release_id: 9c1d0b7e3f2a}
restart:
  description: The plan entries to restart (each with the C(release_id) it runs).
  returned: always
  type: list
  elements: dict
start:
  description: The plan entries to keep enabled and running.
  returned: always
  type: list
  elements: dict
gate:
  description: The plan entries to gate, each with the C(release_id) gated.
  returned: always
  type: list
  elements: dict
quick_check:
  description: The plan entries only asked for C(/health).
  returned: always
  type: list
  elements: dict
compare_shadow:
  description:
    - The production services that wait for their shadow, each with the C(shadow)'s name; after the gates
      (O(gate_results)) also with C(shadow_gate), the shadow's gate result of this run ({} when it was not
      gated), and C(shadow_max_slowdown), the shadow's own (null when it sets none).
  returned: always
  type: list
  elements: dict
rollback:
  description: The failed gate results to roll back, each with its plan entry as C(item) (after the gates).
  returned: always
  type: list
  elements: dict
promote:
  description: The production services to move to the candidate, each with that C(release_id) (after the gates).
  returned: always
  type: list
  elements: dict
msg:
  description: The host's failure message when something is rolled back; empty otherwise.
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.service_actions import service_actions


def main():
    module = AnsibleModule(
        argument_spec=dict(
            services=dict(type="list", elements="dict", required=True),
            releases=dict(type="dict", default={}),
            links=dict(type="list", elements="raw", default=[]),
            changed=dict(type="dict", default={}),
            recorded=dict(type="dict", default={}),
            window_restarted=dict(type="list", elements="str", default=[]),
            gate_results=dict(type="list", elements="dict"),
            shadow_verdicts=dict(type="dict", default={}),
            units_dir=dict(type="path", default="/etc/systemd/system"),
            host=dict(type="str", default="host"),
            state_root=dict(type="path", default="/var/lib/sglang"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    installed = None
    if module.check_mode:
        installed = [
            s["name"] for s in params["services"] if os.path.exists(os.path.join(params["units_dir"], s["unit"]))
        ]
    result = service_actions(
        params["services"],
        params["releases"],
        params["links"],
        params["changed"],
        params["recorded"],
        window_restarted=params["window_restarted"],
        installed=installed,
        gate_results=params["gate_results"],
        shadow_verdicts=params["shadow_verdicts"],
        check_mode=module.check_mode,
        host=params["host"],
        state_root=params["state_root"],
    )
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
