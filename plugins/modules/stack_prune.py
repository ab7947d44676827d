#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: stack_prune
short_description: Remove SGLang stacks that no service can fall back to
version_added: 0.1.0
description:
  - Removes the stacks under I(root) that are neither listed in I(keep) nor used by the release any
    service's C(current) or C(previous) link points to (read from the release's C(manifest.json)).
  - Also removes each pruned stack's wheelhouse under I(wheelhouse_root).
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  root:
    description: Where stacks live.
    type: path
    default: /opt/sglang/stacks
  keep:
    description: Stack ids to keep whatever uses them (the stack of the pin set being deployed).
    type: list
    elements: str
    default: []
  services_root:
    description: Where each service's C(current) and C(previous) links live.
    type: path
    default: /opt/sglang/services
  releases_root:
    description: Where releases live.
    type: path
    default: /opt/sglang/releases
  wheelhouse_root:
    description: Where the hosts' copies of wheelhouses live, one directory per stack id.
    type: path
    default: /opt/sglang/wheelhouse
attributes:
  check_mode:
    support: full
    description: Reports what would be removed, and removes nothing.
  diff_mode:
    support: full
    description: Shows the stack ids before and after.
"""

EXAMPLES = r"""
- name: Prune stacks no service uses
  ddtree.sglang.stack_prune:
    keep:
      - 3f2a9c1d0b7e
"""

RETURN = r"""
removed:
  description: Stack ids removed (or that would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: [0b7e3f2a9c1d]
in_use:
  description: Stack ids used by services, with the links that use them.
  returned: always
  type: dict
  sample: {3f2a9c1d0b7e: [coder/current, coder/previous]}
"""

import os
import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.layout import (
    existing_stacks,
    prune_result,
    release_stack_ids,
    unused,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/opt/sglang/stacks"),
            keep=dict(type="list", elements="str", default=[]),
            services_root=dict(type="path", default="/opt/sglang/services"),
            releases_root=dict(type="path", default="/opt/sglang/releases"),
            wheelhouse_root=dict(type="path", default="/opt/sglang/wheelhouse"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    existing = existing_stacks(params["root"])
    in_use = release_stack_ids(params["services_root"], params["releases_root"])
    removed = unused(existing, params["keep"], in_use)
    result = prune_result(params["root"], "stacks", existing, removed, in_use, module._diff)
    if removed and not module.check_mode:
        for stack in removed:
            for path in (os.path.join(params["root"], stack), os.path.join(params["wheelhouse_root"], stack)):
                if os.path.isdir(path):
                    # Stacks are made read-only once built; root can still remove them.
                    shutil.rmtree(path)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
