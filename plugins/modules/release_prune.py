#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: release_prune
short_description: Remove overlay releases that no service can fall back to
version_added: 0.1.0
description:
  - Removes the releases under I(root) that are neither listed in I(keep) nor the target of any
    service's C(current) or C(previous) link, so a rollback always finds its release.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  root:
    description: Where releases live.
    type: path
    default: /opt/sglang/releases
  services_root:
    description: Where each service's C(current) and C(previous) links live.
    type: path
    default: /opt/sglang/services
  keep:
    description: Release ids to keep whatever uses them (the one being deployed).
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    description: Reports what would be removed, and removes nothing.
  diff_mode:
    support: full
    description: Shows the release ids before and after.
"""

EXAMPLES = r"""
- name: Prune releases no service uses
  ddtree.sglang.release_prune:
    keep: [9c1d0b7e3f2a]
"""

RETURN = r"""
removed:
  description: Release ids removed (or that would be, in check mode).
  returned: always
  type: list
  elements: str
in_use:
  description: Release ids used by services, with the links that use them.
  returned: always
  type: dict
  sample: {9c1d0b7e3f2a: [coder/current], 0b7e3f2a9c1d: [coder/previous]}
"""

import os
import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.layout import (
    directories,
    prune_result,
    releases_in_use,
    unused,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/opt/sglang/releases"),
            services_root=dict(type="path", default="/opt/sglang/services"),
            keep=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    root = module.params["root"]
    existing = directories(root)
    in_use = releases_in_use(module.params["services_root"])
    removed = unused(existing, module.params["keep"], in_use)
    result = prune_result(root, "releases", existing, removed, in_use, module._diff)
    if removed and not module.check_mode:
        for name in removed:
            shutil.rmtree(os.path.join(root, name))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
