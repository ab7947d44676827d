#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_gate_status
short_description: Say whether each SGLang service's current release passed its health gate, and what to do if not
version_added: 0.1.0
description:
  - Reads each service's C(current) and C(previous) links, the gate verdicts that
    M(ddtree.sglang.sglang_health) recorded for them (O(state_root)C(/<service>/verdicts.json)), and the
    unit's state, and says per service what a run must do so the host ends on a release that passed its gate.
  - C(none) - the current release passed its gate.
  - C(gate) - no verdict for it (a rollout died before the gate's verdict, or the release predates
    verdicts), and the unit's main process started after the C(current) link was set, with no
    automatic restart since - gate the running service as it is.
  - C(restart) - no verdict for it, and the process may still be the release before (it started before
    the switch, or within the same second), is down, or was restarted by systemd - restart, then gate.
    Also a failed release with no other release to go back to (the gate decides again).
  - C(rollback) - its gate failed (the rollout died before or during the rollback) - roll back to
    C(previous) without starting the failed release again.
  - The rules are plain functions in C(plugins/module_utils/gate_verdicts.py); C(docs/health-gate.md)
    (section Verdicts) has the table.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  services:
    description: The services' names; each unit is C(sglang-<name>.service).
    type: list
    elements: str
    required: true
  services_root:
    description: Where services' links live.
    type: path
    default: /opt/sglang/services
  state_root:
    description: Where services' state lives (the verdicts are in C(<state_root>/<service>/verdicts.json)).
    type: path
    default: /var/lib/sglang
extends_documentation_fragment:
  - ddtree.sglang.attributes.read_only
notes:
  - Needs C(systemctl) on the host.
seealso:
  - module: ddtree.sglang.sglang_health
  - module: ddtree.sglang.service_link
"""

EXAMPLES = r"""
- name: Find services left without a passed gate by an interrupted rollout
  ddtree.sglang.service_gate_status:
    services: [coder]
  register: gate_status

- name: Say which ones need a gate
  ansible.builtin.debug:
    msg: "{{ gate_status.services | dict2items | rejectattr('value.action', 'eq', 'none') | map(attribute='key') | list
      }}"
"""

RETURN = r"""
services:
  description:
    - Per service - C(action) (C(none), C(gate), C(restart), C(rollback)), C(reason) (C(passed),
      C(interrupted) - verdicts exist but none for this release, C(no_verdicts_yet) - none for the
      service at all, C(failed_verdict), C(no_release)), the release ids, the current and previous
      releases' verdicts, and the unit's facts.
  returned: success
  type: dict
  sample:
    coder:
      action: restart
      reason: interrupted
      release_id: 706e0f57c4b4
      previous_release_id: 0b7e3f2a9c1d
      unit: sglang-coder.service
      verdict: null
      previous_verdict: {verdict: passed, recorded_at: "2026-11-30T10:01:00Z", stage: performance}
      unit_state: {active: true, restarts: 0, process_start: 1732960000.0, started_after_switch: false}
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.gate_verdicts import (
    UNIT_PROPERTIES,
    gate_action,
    started_after,
    unit_facts,
    verdicts_path,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.health_gate import unit_name
from ansible_collections.ddtree.sglang.plugins.module_utils.health_records import read_json
from ansible_collections.ddtree.sglang.plugins.module_utils.health_unit import parse_systemctl_show
from ansible_collections.ddtree.sglang.plugins.module_utils.layout import service_release_ids


def link_mtime(path):
    """When a link itself was last set (its own mtime, not its target's), or None."""
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            services=dict(type="list", elements="str", required=True),
            services_root=dict(type="path", default="/opt/sglang/services"),
            state_root=dict(type="path", default="/var/lib/sglang"),
        ),
        supports_check_mode=True,
    )
    systemctl = module.get_bin_path("systemctl", required=True)
    services = {}
    for service in module.params["services"]:
        links = service_release_ids(module.params["services_root"], service)
        path = verdicts_path(module.params["state_root"], service)
        try:
            document = read_json(path)
        except (OSError, ValueError) as error:
            module.fail_json(
                msg="cannot read the gate verdicts of %s (%s): %s. Move the file aside: the service is then "
                "gated once as if it had no verdicts." % (service, path, error)
            )
        unit = unit_name(service)
        rc, out, err = module.run_command(
            [systemctl, "show", "--timestamp=unix", "-p", ",".join(UNIT_PROPERTIES), unit]
        )
        if rc != 0:
            module.fail_json(msg="systemctl show %s failed (rc %d): %s" % (unit, rc, err.strip()))
        facts = unit_facts(parse_systemctl_show(out))
        facts["started_after_switch"] = started_after(
            facts["process_start"], link_mtime(os.path.join(module.params["services_root"], service, "current"))
        )
        decision = gate_action(
            links["current"],
            links["previous"],
            document,
            facts["active"],
            facts["started_after_switch"],
            facts["restarts"],
        )
        services[service] = dict(
            decision, release_id=links["current"], previous_release_id=links["previous"], unit=unit, unit_state=facts
        )
    module.exit_json(changed=False, services=services)


if __name__ == "__main__":
    main()
