#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fleet_baselines
short_description: Add a host's new greedy baselines to the fleet's, kept on the controller
version_added: 0.1.0
description:
  - The fleet's baselines are the reference of a host that has no baseline of its own for a key (model,
    decoding family, tensor-parallel size, SGLang version) - a blank host's first release is compared with
    them by M(ddtree.sglang.sglang_health) (its O(ddtree.sglang.sglang_health#module:fleet_baselines)
    option), so a lossy first release is rolled back instead of becoming the baseline.
  - Adds each entry of O(baselines) (what a gate recorded, its result's C(baseline.new_baselines)) that
    O(path) has no entry for under the same key, C(max_tokens) and prompt, with O(host) as where it came
    from. An entry O(path) has is the reference and is never replaced.
  - Runs on the controller (C(delegate_to) C(localhost)). Hosts gated at once add under an exclusive lock
    (C(<path>.lock)); the file is written whole (a temporary file, then a rename).
  - The rules are plain functions in C(plugins/module_utils/fleet_baselines.py); C(docs/health-gate.md)
    (section The fleet's baselines) says why the fleet keeps them.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  path:
    description: The fleet's baselines file on the controller (created with its directory when missing).
    type: path
    required: true
  baselines:
    description: A baselines document (the format of M(ddtree.sglang.sglang_health)'s C(baseline_file)).
    type: dict
  gate_results:
    description:
      - Instead of O(baselines) - M(ddtree.sglang.sglang_health) results (a registered loop's C(results)); the new
        baselines of each gate that ran and passed are added (C(baseline.new_baselines)), none of a failed one.
    type: list
    elements: dict
  host:
    description: The host the baselines were recorded on, kept with each entry added.
    type: str
    required: true
attributes:
  check_mode:
    support: full
    description: Reports what would be added, and writes nothing.
  diff_mode:
    support: full
    description: Shows the entries added (key, max_tokens, prompt).
seealso:
  - module: ddtree.sglang.sglang_health
  - plugin: ddtree.sglang.fleet_baselines
    plugin_type: lookup
"""

EXAMPLES = r"""
- name: Add the new baselines of every gate of the loop that passed
  ddtree.sglang.fleet_baselines:
    path: "{{ lookup('ddtree.sglang.cache_dir', 'fleet-baselines') }}/fleet.json"
    gate_results: "{{ gates.results }}"
    host: "{{ inventory_hostname }}"
  delegate_to: localhost

- name: Add the gate's new baselines to the fleet's
  ddtree.sglang.fleet_baselines:
    path: "{{ lookup('ddtree.sglang.cache_dir', 'fleet-baselines') }}/fleet.json"
    baselines: "{{ gate.baseline.new_baselines }}"
    host: "{{ inventory_hostname }}"
  delegate_to: localhost
  when: gate.baseline.new_baselines is defined
"""

RETURN = r"""
added:
  description: The entries added, each C(key), C(max_tokens) and C(prompt).
  returned: success
  type: list
  elements: dict
  sample: [{key: "qwen3-coder | DFLASH | tp 2 | sglang 0.5.23", max_tokens: 64,
            prompt: "List the first ten prime numbers, separated by commas."}]
path:
  description: The fleet's baselines file.
  returned: success
  type: str
"""

import contextlib
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.fleet_baselines import fleet_add, gates_new_baselines
from ansible_collections.ddtree.sglang.plugins.module_utils.health_records import read_json, write_json
from ansible_collections.ddtree.sglang.plugins.module_utils.host_lock import LockTimeout, exclusive

# Hosts add within seconds of each other; a holder that takes longer is stuck.
LOCK_TIMEOUT_S = 120


def describe(added: list) -> str:
    return "".join(
        "%s | max_tokens %s | %s\n" % (entry["key"], entry["max_tokens"], entry["prompt"]) for entry in added
    )


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            baselines=dict(type="dict"),
            gate_results=dict(type="list", elements="dict"),
            host=dict(type="str", required=True),
        ),
        mutually_exclusive=[("baselines", "gate_results")],
        required_one_of=[("baselines", "gate_results")],
        supports_check_mode=True,
    )
    path = module.params["path"]
    directory = os.path.dirname(path) or "."
    try:
        with contextlib.ExitStack() as held:
            # Check mode reads without the lock (a file written whole is never half there) and writes nothing.
            if not module.check_mode:
                os.makedirs(directory, 0o755, exist_ok=True)
                held.enter_context(exclusive(path + ".lock", timeout=LOCK_TIMEOUT_S))
            merged, added = read_json(path), []
            documents = (
                [module.params["baselines"]]
                if module.params["baselines"] is not None
                else gates_new_baselines(module.params["gate_results"])
            )
            for document in documents:
                merged, added_here = fleet_add(merged, document, module.params["host"])
                added += added_here
            if added and not module.check_mode:
                write_json(path, merged, module.atomic_move)
    except LockTimeout as error:
        module.fail_json(
            msg="the fleet's baselines %s: %s, longer than any addition takes: look at that process "
            "(a run stuck while adding)" % (path, error),
            path=path,
        )
    except (OSError, ValueError) as error:
        module.fail_json(
            msg="the fleet's baselines %s cannot be updated: %s (fix or move the file away; the next "
            "gate records a new one)" % (path, error),
            path=path,
        )
    result = dict(changed=bool(added), added=added, path=path)
    if module._diff and added:
        result["diff"] = {"before": "", "after": describe(added), "after_header": path}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
