#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_release_choice
short_description: Choose the release each SGLang service runs - the candidate, a pinned one, or the base release
version_added: 0.1.0
description:
  - A service whose algorithm loads the overlay (C(DDTREE)) runs the rollout's candidate
    (O(candidate_id)) unless its C(release) pins a release by id or source revision; a pinned
    service stays on that release whatever the rollout builds.
  - Every other service (NEXTN, EAGLE, DFLASH, NONE, ...) runs the host's base release (O(base_id)),
    which holds nothing of the overlay, so an overlay change neither restarts it nor changes what it runs.
  - Reads the manifests under O(releases_root) to resolve pins, and fails naming every pin that names no
    release on the host (or several), with the releases that are there.
  - A production service that has a shadow (a service with C(shadow_of) naming it) and runs another
    overlay release than the candidate stays on the release it runs (C(follows=shadow)) - the shadow
    takes the candidate first, and the role promotes it only after M(ddtree.sglang.service_shadow_compare)
    says so (docs/services.md, "Shadow services"). Which release it runs is read from its C(current) link
    under O(services_root).
  - Changes nothing; M(ddtree.sglang.service_link) then points each service at its choice.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  services:
    description: The plan's services (M(ddtree.sglang.service_plan)), each with C(name), C(algorithm) and C(release).
    type: list
    elements: dict
    required: true
  candidate_id:
    description: The release this run built from the overlay (M(ddtree.sglang.release)).
    type: str
    required: true
  base_id:
    description:
      - The host's base release (M(ddtree.sglang.release) with O(ddtree.sglang.release#module:overlay=false)).
      - Needed when a service does not load the overlay.
    type: str
  stack_id:
    description: The host's active stack, which a pin by revision prefers when the revision was built for several
      stacks.
    type: str
  releases_root:
    description: Where releases live.
    type: path
    default: /opt/sglang/releases
  services_root:
    description: Where each service's C(current) link is (the release a production service with a shadow stays on).
    type: path
    default: /opt/sglang/services
  host:
    description: The host's name, for messages.
    type: str
    default: host
extends_documentation_fragment:
  - ddtree.sglang.attributes.read_only
seealso:
  - module: ddtree.sglang.service_link
  - module: ddtree.sglang.release
"""

EXAMPLES = r"""
- name: Choose each service's release
  ddtree.sglang.service_release_choice:
    services: "{{ plan.services }}"
    candidate_id: "{{ release.release_id }}"
    base_id: "{{ base_release.release_id }}"
    stack_id: "{{ sglang_stack_active.id }}"
    host: "{{ inventory_hostname }}"
  register: choice
"""

RETURN = r"""
services:
  description:
    - Per service, the release it runs, what it follows (C(candidate), C(pin), C(base), or C(shadow) - a
      production service that waits for its shadow; then also C(candidate_id) and C(shadow)) and why.
  returned: success
  type: dict
  sample:
    coder: {release_id: 9c1d0b7e3f2a, release_dir: /opt/sglang/releases/9c1d0b7e3f2a, follows: candidate,
            overlay: true, reason: "follows the rollout's candidate"}
    chat: {release_id: 4b2e6f1a0c3d, release_dir: /opt/sglang/releases/4b2e6f1a0c3d, follows: base, overlay: false,
           reason: "NEXTN does not load the overlay: the base release (the stack alone)"}
    writer: {release_id: 0b7e3f2a9c1d, release_dir: /opt/sglang/releases/0b7e3f2a9c1d, follows: shadow, overlay: true,
             candidate_id: 9c1d0b7e3f2a, shadow: writer-shadow,
             reason: "stays on 0b7e3f2a9c1d until its shadow writer-shadow has run the candidate 9c1d0b7e3f2a and was
               not worse"}
keep:
  description: Every release a service runs after this choice, the candidate and the base release (what pruning must
    keep).
  returned: success
  type: list
  elements: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.layout import directories
from ansible_collections.ddtree.sglang.plugins.module_utils.release import MANIFEST
from ansible_collections.ddtree.sglang.plugins.module_utils.service_releases import choose_releases, loads_overlay
from ansible_collections.ddtree.sglang.plugins.module_utils.shadows import hold_for_shadows


def read_manifests(root):
    """{release id: manifest without per-file hashes} of the complete releases under root."""
    releases = {}
    for name in directories(root):
        try:
            with open(os.path.join(root, name, MANIFEST)) as handle:
                manifest = json.load(handle)
        except (OSError, ValueError):
            continue  # partial: never chosen (and never activated: service_link verifies)
        releases[name] = {key: value for key, value in manifest.items() if key not in ("files", "links")}
    return releases


def current_releases(services_root, names):
    """{service: the release id its current link names, or None}."""
    current = {}
    for name in names:
        try:
            current[name] = os.path.basename(os.readlink(os.path.join(services_root, name, "current")))
        except OSError:
            current[name] = None
    return current


def main():
    module = AnsibleModule(
        argument_spec=dict(
            services=dict(type="list", elements="dict", required=True),
            candidate_id=dict(type="str", required=True),
            base_id=dict(type="str"),
            stack_id=dict(type="str"),
            releases_root=dict(type="path", default="/opt/sglang/releases"),
            services_root=dict(type="path", default="/opt/sglang/services"),
            host=dict(type="str", default="host"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    needs_base = [
        service["name"] for service in params["services"] if not loads_overlay(service.get("algorithm", "NONE"))
    ]
    if needs_base and not params["base_id"]:
        module.fail_json(
            msg="services %s do not load the overlay and need the base release: give base_id" % ", ".join(needs_base)
        )
    releases = read_manifests(params["releases_root"])
    choices, problems = choose_releases(
        params["services"], params["candidate_id"], params["base_id"], releases, params["stack_id"], params["host"]
    )
    productions = [service["shadow_of"] for service in params["services"] if service.get("shadow_of")]
    if productions and not problems:
        choices = hold_for_shadows(
            choices,
            params["services"],
            current_releases(params["services_root"], productions),
            releases,
            params["candidate_id"],
        )
    if problems:
        module.fail_json(
            msg="%d release pin(s) cannot be met, nothing was changed: %s" % (len(problems), " | ".join(problems)),
            problems=problems,
        )
    for choice in choices.values():
        choice["release_dir"] = os.path.join(params["releases_root"], choice["release_id"])
    # The candidate and the base release too: a tuned service running DDTREE names the base release in no link,
    # but its DFLASH is measured on it (and falls back to it); rebuilding either every run would be a change.
    keep = {choice["release_id"] for choice in choices.values()} | {params["candidate_id"], params["base_id"]}
    module.exit_json(changed=False, services=choices, keep=sorted(keep - {None}))


if __name__ == "__main__":
    main()
