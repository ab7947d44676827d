# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: fleet_baselines
short_description: The fleet's greedy baselines, read from the controller's file
version_added: 0.1.0
description:
  - Reads the fleet's baselines file (what M(ddtree.sglang.fleet_baselines) adds to) on the controller, checked,
    for M(ddtree.sglang.sglang_health)'s O(ddtree.sglang.sglang_health#module:fleet_baselines) option.
  - A file that does not exist yet is an empty document (no host recorded anything yet).
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  _terms:
    description: The file (one path).
    type: list
    elements: path
    required: true
"""

EXAMPLES = r"""
- name: Gate with the fleet's baselines as the reference of a blank host
  ddtree.sglang.sglang_health:
    name: coder
    baseline_file: /var/lib/sglang/coder/baseline.json
    fleet_baselines: "{{ lookup('ddtree.sglang.fleet_baselines', '/srv/fleet/baselines.json') }}"
"""

RETURN = r"""
_raw:
  description: The baselines document (C(format) 2, C(baselines) by key, max_tokens and prompt), one per term.
  type: list
  elements: dict
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.ddtree.sglang.plugins.module_utils.fleet_baselines import read_fleet


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        try:
            return [read_fleet(path) for path in terms]
        except ValueError as error:
            raise AnsibleLookupError(str(error)) from error
