#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_link
short_description: Point an SGLang service at a release, atomically, keeping the one to fall back to
version_added: 0.1.0
description:
  - Each service has C(<services_root>/<service>/current) and C(previous), links to releases in
    I(releases_root) (relative, so the tree can be moved whole).
  - With I(state=current), makes C(current) point at I(release_id) and C(previous) at the release
    C(current) pointed at before (when it differs). Each link is replaced with one C(rename), so a
    reader sees the old or the new target, never none.
  - With O(verdicts_file) (the health gate's verdicts, M(ddtree.sglang.sglang_health)), C(previous) only
    ever becomes a release that passed its gate - a C(current) left unverified or failed by an
    interrupted rollout is skipped, and the C(previous) before it kept. Without verdicts for the
    service (a host from before them), C(current) becomes C(previous) as above.
  - With I(state=previous) (a rollback), swaps C(current) and C(previous).
  - The release is verified against its manifest first; a partial or tampered release is never
    activated.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  service:
    description: The service's name.
    type: str
    required: true
  release_id:
    description: The release to activate. Required with I(state=current).
    type: str
  state:
    description: Activate I(release_id) (C(current)) or go back to C(previous).
    type: str
    choices: [current, previous]
    default: current
  services_root:
    description: Where services' links live.
    type: path
    default: /opt/sglang/services
  releases_root:
    description: Where releases live.
    type: path
    default: /opt/sglang/releases
  verdicts_file:
    description: The service's gate verdicts (C(/var/lib/sglang/<service>/verdicts.json)); unset, they are not
      consulted.
    type: path
attributes:
  check_mode:
    support: full
    description:
      - Reports what would change, and changes nothing.
      - A release that is not built yet (a plan for a new release) is reported as the new target, unverified.
  diff_mode:
    support: full
    description: Shows the links' targets before and after.
"""

EXAMPLES = r"""
- name: Switch the coder service to a new release
  ddtree.sglang.service_link:
    service: coder
    release_id: 9c1d0b7e3f2a

- name: Roll the coder service back
  ddtree.sglang.service_link:
    service: coder
    state: previous
"""

RETURN = r"""
service:
  description: The service whose links these are.
  returned: success
  type: str
  sample: coder
state:
  description: What was asked - C(current) (activate a release) or C(previous) (a rollback).
  returned: success
  type: str
  sample: current
release_id:
  description: The release C(current) points at afterwards (the release the service runs).
  returned: always
  type: str
  sample: 9c1d0b7e3f2a
previous_release_id:
  description: The release C(previous) points at afterwards (null when none).
  returned: always
  type: str
  sample: 0b7e3f2a9c1d
before:
  description: The same two before the change.
  returned: always
  type: dict
  sample: {release_id: 0b7e3f2a9c1d, previous_release_id: null}
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.gate_verdicts import fallback_after_switch
from ansible_collections.ddtree.sglang.plugins.module_utils.health_records import read_json
from ansible_collections.ddtree.sglang.plugins.module_utils.layout import release_link_target, service_release_ids
from ansible_collections.ddtree.sglang.plugins.module_utils.release import verify_release


def replace_link(link, target):
    """Point link at target with one rename: a reader sees the old or the new target, never none."""
    tmp = "%s.tmp-%d" % (link, os.getpid())
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def named(links):
    """current/previous link -> the result's names for the release ids they hold."""
    return {"release_id": links["current"], "previous_release_id": links["previous"]}


def _links_after(module, before: dict) -> dict:
    """{current, previous} after this call: the release switched to (previous: the last that passed its gate),
    or the previous release rolled back to."""
    params = module.params
    if params["state"] == "current":
        try:
            verdicts = read_json(params["verdicts_file"])
        except (OSError, ValueError) as error:
            module.fail_json(
                msg="cannot read the gate verdicts of %s (%s): %s"
                % (params["service"], params["verdicts_file"], error),
                before=named(before),
            )
        return {
            "current": params["release_id"],
            "previous": fallback_after_switch(before["current"], before["previous"], params["release_id"], verdicts),
        }
    if not before["previous"]:
        module.fail_json(
            msg="service %s has no previous release to go back to" % params["service"], before=named(before)
        )
    return {"current": before["previous"], "previous": before["current"]}


def _switch(module, service_dir: str, before: dict, after: dict):
    """Point the links at `after`: previous first, so that at every moment current names a good release."""
    params = module.params
    os.makedirs(service_dir, exist_ok=True)
    for link in ("previous", "current"):
        if after[link] and after[link] != before[link]:
            replace_link(
                os.path.join(service_dir, link),
                release_link_target(params["services_root"], params["service"], params["releases_root"], after[link]),
            )


def main():
    module = AnsibleModule(
        argument_spec=dict(
            service=dict(type="str", required=True),
            release_id=dict(type="str"),
            state=dict(type="str", choices=["current", "previous"], default="current"),
            services_root=dict(type="path", default="/opt/sglang/services"),
            releases_root=dict(type="path", default="/opt/sglang/releases"),
            verdicts_file=dict(type="path"),
        ),
        required_if=[("state", "current", ("release_id",))],
        supports_check_mode=True,
    )
    params = module.params
    service_dir = os.path.join(params["services_root"], params["service"])
    before = service_release_ids(params["services_root"], params["service"])
    after = _links_after(module, before)
    release_dir = os.path.join(params["releases_root"], after["current"])
    if module.check_mode and params["state"] == "current" and not os.path.exists(release_dir):
        # A plan: the release is built (and verified) by the run that activates it.
        problems = []
        module.warn(
            "release %s is not built yet; it is verified when it is built, before activation" % after["current"]
        )
    else:
        problems = verify_release(release_dir)
    if problems:
        module.fail_json(
            msg="release %s will not be activated for %s: %s"
            % (after["current"], params["service"], "; ".join(problems[:5])),
            problems=problems,
            before=named(before),
        )
    changed = after != before
    result = dict(
        changed=changed, service=params["service"], state=params["state"], before=named(before), **named(after)
    )
    if module._diff:
        result["diff"] = {
            "before": "current -> %s\nprevious -> %s\n" % (before["current"], before["previous"]),
            "after": "current -> %s\nprevious -> %s\n" % (after["current"], after["previous"]),
            "before_header": service_dir,
            "after_header": service_dir,
        }
    if changed and not module.check_mode:
        _switch(module, service_dir, before, after)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
