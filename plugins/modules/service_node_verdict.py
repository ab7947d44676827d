#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_node_verdict
short_description: Judge an SGLang service across hosts as a whole, and record the verdict on this node
version_added: 0.1.0
description:
  - The verdict of a service across hosts (docs/services.md, "Services across hosts"), the same on every node.
    It passes when the head's gate passed and every rank ran throughout; a rank that died or restarted fails
    it, named with its host and journal, before the head's own failure (the head ends when a peer dies).
  - Records the verdict for the release in O(verdict_file) on this node (replacing the head's own gate verdict
    there), so an interrupted rollout finds the same verdict on every node.
  - The rules are plain functions in C(plugins/module_utils/service_nodes.py).
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  name:
    description: The service's name.
    type: str
    required: true
  release_id:
    description: The release the verdict is about.
    type: str
    required: true
  head_gate:
    description:
      - The head's gate result (M(ddtree.sglang.sglang_health)'s); unset when the head's gate did not run.
      - Returned with the verdict over it, so the rollout's report shows the head's measurements.
    type: dict
  rank_checks:
    description: Every node's M(ddtree.sglang.service_rank_check) result.
    type: list
    elements: dict
    required: true
  hosts:
    description: The service's nodes in rank order; each must have a rank check in O(rank_checks).
    type: list
    elements: str
    required: true
  verdict_file:
    description: This node's verdicts file of the service.
    type: path
    required: true
attributes:
  check_mode:
    support: full
    description: Judges, and records nothing.
  diff_mode:
    support: none
    description: The verdicts file is a record, not configuration; there is nothing to diff.
"""

EXAMPLES = r"""
- name: Judge kimi from its head's gate and every rank
  ddtree.sglang.service_node_verdict:
    name: kimi
    release_id: 3f2a9c0d1e7b
    head_gate: {passed: true, msg: "kimi: every check passed"}
    rank_checks:
      - {host: ct200, rank: 0, active: true, restarts: 0, fatal: [], journal: []}
      - {host: ct129, rank: 1, active: false, state: failed/failed, restarts: 1, fatal: [], journal: []}
    hosts: [ct200, ct129]
    verdict_file: /var/lib/sglang/kimi/verdicts.json
"""

RETURN = r"""
name:
  description: The service's name.
  returned: success
  type: str
service:
  description: The service's name (as M(ddtree.sglang.sglang_health) returns it, for the rollout's report).
  returned: success
  type: str
release_id:
  description: The release judged.
  returned: success
  type: str
startup:
  description: The head's gate's C(startup), and likewise C(health), C(chat), C(baseline), C(performance), C(timings).
  returned: when the head's gate ran
  type: dict
passed:
  description: Whether the whole service passed.
  returned: success
  type: bool
msg:
  description: Why; a failed rank is named with its host and its journal's last lines.
  returned: success
  type: str
failed_host:
  description: The host of the rank that failed first.
  returned: when a rank failed
  type: str
failed_rank:
  description: The rank that failed first.
  returned: when a rank failed
  type: int
journal_excerpt:
  description: The failed rank's journal lines.
  returned: when a rank failed
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.gate_verdicts import utc_now, verdict_record, verdicts_add
from ansible_collections.ddtree.sglang.plugins.module_utils.health_records import read_json, write_json
from ansible_collections.ddtree.sglang.plugins.module_utils.service_nodes import group_verdict


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            release_id=dict(type="str", required=True),
            head_gate=dict(type="dict"),
            rank_checks=dict(type="list", elements="dict", required=True),
            hosts=dict(type="list", elements="str", required=True),
            verdict_file=dict(type="path", required=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    verdict = group_verdict(params["name"], params["head_gate"], params["rank_checks"], params["hosts"])
    if not module.check_mode:
        try:
            document = verdicts_add(
                read_json(params["verdict_file"]),
                params["release_id"],
                verdict_record(verdict["passed"], dict(params["head_gate"] or {}, **verdict), utc_now()),
            )
            write_json(params["verdict_file"], document, module.atomic_move)
        except (OSError, ValueError) as error:
            module.fail_json(msg="the verdict of %s could not be recorded: %s" % (params["name"], error), **verdict)
    # The head's gate result with the whole service's verdict over it: the rollout's report reads it as the gate.
    result = dict(params["head_gate"] or {}, **verdict)
    module.exit_json(
        changed=not module.check_mode,
        name=params["name"],
        service=params["name"],
        release_id=params["release_id"],
        **result,
    )


if __name__ == "__main__":
    main()
