#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: monitoring_targets
short_description: Write Prometheus's targets for the fleet's SGLang services, and the gate's records as rules
version_added: 0.1.0
description:
  - Writes O(targets_file), a Prometheus file-based service discovery document (C(file_sd_configs)) with one
    target per service that exports its metrics (the service field C(metrics), true by default), at
    C(ADDRESS:PORT), labelled C(host), C(service), C(algorithm) and C(release_id) (the release its
    C(current) link names).
  - Writes O(records_file), a Prometheus rules file of constant recording rules made from what each
    service's health gate recorded for its current release (docs/monitoring.md lists the series); the
    collection's alert rules compare the live metrics with them.
  - Each file is replaced whole (written beside it, then renamed), and only when its content changes.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  hosts:
    description: Per inventory host scraped, its C(sglang_services) declarations.
    type: dict
    required: true
  gate_status:
    description:
      - The results of M(ddtree.sglang.service_gate_status), looped over the hosts of O(hosts) with the host as
        C(item) (each host's current releases and their verdicts). A host without a result gets targets
        without C(release_id) and no gate records.
    type: list
    elements: dict
    default: []
  address:
    description:
      - Where every target is scraped. Empty, each host's inventory name. C(127.0.0.1) when Prometheus runs on
        the host it scrapes.
    type: str
    default: ""
  targets_file:
    description: The file_sd JSON file to write.
    type: path
    required: true
  records_file:
    description: The rules file of the gate's records to write (JSON, which Prometheus reads as YAML).
    type: path
    required: true
  throughput_margin:
    description: The share of the gate's measured tokens/s the live throughput may lose before it alerts.
    type: float
    default: 0.5
  accept_length_floor:
    description: The acceptance length of a speculative service below which it alerts (1 is no draft accepted).
    type: float
    default: 1.3
  mode:
    description: The files' mode.
    type: raw
    default: "0644"
attributes:
  check_mode:
    support: full
    description: Says whether either file would change, and changes nothing.
  diff_mode:
    support: full
    description: The old and new content of each file that changes.
seealso:
  - module: ddtree.sglang.service_gate_status
"""

EXAMPLES = r"""
- name: Read each scraped host's current releases and their gate verdicts
  ddtree.sglang.service_gate_status:
    services: "{{ hostvars[item].sglang_services | map(attribute='name') | list }}"
  delegate_to: "{{ item }}"
  loop: "{{ groups['gpu'] }}"
  register: gate_status

- name: Write the targets and the gate's records
  ddtree.sglang.monitoring_targets:
    hosts: "{{ dict(groups['gpu'] | zip(groups['gpu'] | map('extract', hostvars, 'sglang_services'))) }}"
    gate_status: "{{ gate_status.results }}"
    targets_file: /etc/prometheus/ddtree-sglang/targets/sglang.json
    records_file: /etc/prometheus/ddtree-sglang/rules/gate-records.rules.yml
"""

RETURN = r"""
targets:
  description: The file_sd document written.
  returned: success
  type: list
  elements: dict
  sample: [{targets: ["ct200:30000"], labels: {host: ct200, service: coder, algorithm: DDTREE,
    release_id: 9c1d0b7e3f2a}}]
records:
  description: The rules document of the gate's records written.
  returned: success
  type: dict
changed_files:
  description: The files that changed (or would, in check mode).
  returned: success
  type: list
  elements: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.monitoring import (
    gate_records,
    status_by_host,
    target_groups,
)


def read_text(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def write(module, path, content, diffs):
    """Write content to path when it differs; True when it does (or would)."""
    before = read_text(path)
    if before == content:
        return False
    if module._diff:
        diffs.append({"before": before or "", "after": content, "before_header": path, "after_header": path})
    if module.check_mode:
        return True
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        module.fail_json(msg="%s: the directory %s does not exist; create it first" % (path, directory))
    temporary = os.path.join(directory, ".%s.tmp" % os.path.basename(path))
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(content)
    module.set_mode_if_different(temporary, module.params["mode"], False)
    module.atomic_move(temporary, path)
    return True


def main():
    module = AnsibleModule(
        argument_spec=dict(
            hosts=dict(type="dict", required=True),
            gate_status=dict(type="list", elements="dict", default=[]),
            address=dict(type="str", default=""),
            targets_file=dict(type="path", required=True),
            records_file=dict(type="path", required=True),
            throughput_margin=dict(type="float", default=0.5),
            accept_length_floor=dict(type="float", default=1.3),
            mode=dict(type="raw", default="0644"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    hosts = {host: services or [] for host, services in params["hosts"].items()}
    status = status_by_host(params["gate_status"])
    targets = target_groups(hosts, status, params["address"])
    try:
        records = gate_records(hosts, status, params["throughput_margin"], params["accept_length_floor"])
    except ValueError as error:
        module.fail_json(msg=str(error))
    diffs, changed_files = [], []
    for path, document in ((params["targets_file"], targets), (params["records_file"], records)):
        if write(module, path, json.dumps(document, indent=2, sort_keys=True) + "\n", diffs):
            changed_files.append(path)
    result = dict(changed=bool(changed_files), changed_files=changed_files, targets=targets, records=records)
    if module._diff:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
