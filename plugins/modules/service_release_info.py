#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_release_info
short_description: Say which release each SGLang service runs, and which it would fall back to
version_added: 0.1.0
description:
  - Reads each service's C(current) and C(previous) links under I(services_root), as
    M(ddtree.sglang.service_link) writes them, and returns the release ids they name.
  - Rollouts record this before they change anything, so a report can say what each host had.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  services:
    description: The services to read; a service without links has null release ids.
    type: list
    elements: str
    required: true
  services_root:
    description: Where services' links live.
    type: path
    default: /opt/sglang/services
extends_documentation_fragment:
  - ddtree.sglang.attributes.read_only
seealso:
  - module: ddtree.sglang.service_link
"""

EXAMPLES = r"""
- name: Remember which release each service runs before the rollout
  ddtree.sglang.service_release_info:
    services: "{{ sglang_services | map(attribute='name') | list }}"
  register: releases_before
"""

RETURN = r"""
services:
  description: Per service, the release C(current) names (C(release_id)) and the one C(previous) names.
  returned: success
  type: dict
  sample: {coder: {release_id: 9c1d0b7e3f2a, previous_release_id: 0b7e3f2a9c1d}, chat: {release_id: null,
    previous_release_id: null}}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.layout import service_release_ids


def main():
    module = AnsibleModule(
        argument_spec=dict(
            services=dict(type="list", elements="str", required=True),
            services_root=dict(type="path", default="/opt/sglang/services"),
        ),
        supports_check_mode=True,
    )
    services = {}
    for service in module.params["services"]:
        links = service_release_ids(module.params["services_root"], service)
        services[service] = {"release_id": links["current"], "previous_release_id": links["previous"]}
    module.exit_json(changed=False, services=services)


if __name__ == "__main__":
    main()
