#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_rank_check
short_description: Say whether one rank of an SGLang service across hosts ran throughout since its start
version_added: 0.1.0
description:
  - One node's part of the verdict of a service across hosts (docs/services.md, "Services across hosts") - its
    unit's state now, the automatic restarts (systemd's C(Scheduled restart job)) and the fatal journal lines
    since O(since). M(ddtree.sglang.service_node_verdict) judges the whole service from every node's answer and
    the head's gate.
  - Reads only; the rules are plain functions in C(plugins/module_utils/service_nodes.py).
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  name:
    description: The service's name; the unit is C(sglang-<name>.service).
    type: str
    required: true
  rank:
    description: This node's rank in the service (0 is the head).
    type: int
    required: true
  since:
    description: Start of the journal to read, as C(journalctl --since) takes it (the time before the start).
    type: str
    required: true
  host:
    description: This host's name, for the verdict's message.
    type: str
    default: host
extends_documentation_fragment:
  - ddtree.sglang.attributes.read_only
"""

EXAMPLES = r"""
- name: Check this node's rank of kimi since the restart
  ddtree.sglang.service_rank_check:
    name: kimi
    rank: 1
    since: "2026-12-04 17:00:00"
    host: "{{ inventory_hostname }}"
  register: rank
"""

RETURN = r"""
host:
  description: This host's name.
  returned: success
  type: str
rank:
  description: This node's rank.
  returned: success
  type: int
active:
  description: Whether the unit is active now.
  returned: success
  type: bool
state:
  description: The unit's C(ActiveState/SubState).
  returned: success
  type: str
  sample: failed/failed
restarts:
  description: Automatic restarts since O(since).
  returned: success
  type: int
fatal:
  description: The journal's fatal lines since O(since).
  returned: success
  type: list
  elements: str
journal:
  description: The journal's last lines since O(since), the evidence a failed verdict names.
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.health_journal import match_signatures, split_journal_output
from ansible_collections.ddtree.sglang.plugins.module_utils.health_unit import parse_systemctl_show
from ansible_collections.ddtree.sglang.plugins.module_utils.service_nodes import rank_check


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            rank=dict(type="int", required=True),
            since=dict(type="str", required=True),
            host=dict(type="str", default="host"),
        ),
        supports_check_mode=True,
    )
    unit = "sglang-%s.service" % module.params["name"]
    systemctl = module.get_bin_path("systemctl", required=True)
    journalctl = module.get_bin_path("journalctl", required=True)
    rc, out, err = module.run_command([systemctl, "show", "-p", "ActiveState,SubState", unit])
    if rc != 0:
        module.fail_json(msg="systemctl show %s failed: %s" % (unit, err.strip()))
    rc, journal, err = module.run_command(
        [journalctl, "-u", unit, "--no-pager", "-q", "-o", "cat", "--since", module.params["since"]]
    )
    if rc != 0:
        module.fail_json(msg="journalctl -u %s failed: %s" % (unit, err.strip()))
    lines = split_journal_output(journal)[0]
    result = rank_check(
        module.params["host"], module.params["rank"], parse_systemctl_show(out), lines, match_signatures(lines)
    )
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
