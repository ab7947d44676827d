#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_autotune_window
short_description: Stop an SGLang service for a tuning on its own GPUs, a restore armed on the host, and start it again
version_added: 0.2.0
description:
  - For a service tuned with C(autotune.own_gpus) (docs/autotune.md), in the host's rollout window.
  - O(state=stopped) - when the service serves (or served before a tuning that was cut short, its restore still
    armed), cancels a restore left armed, arms the host's own restore (a transient systemd timer,
    C(sglang-<service>-autotune-restore), that stops the temporary instance and starts the service after
    O(restore_after) seconds unless disarmed) and stops the service. A service that does not serve is left alone.
  - O(state=started) - disarms the restore (when it has not fired yet) and starts the service again on the release it
    served, unless the restore started it already.
  - The commands are chosen by plain functions in C(plugins/module_utils/autotune_trials.py).
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  service:
    description: The service's name (its unit is C(sglang-<service>.service)).
    type: str
    required: true
  state:
    description: C(stopped) for its grid, or C(started) again afterwards.
    type: str
    required: true
    choices: [stopped, started]
  restore_after:
    description: With O(state=stopped) - seconds after which the host starts the service again by itself
      (M(ddtree.sglang.service_autotune)'s RV(ddtree.sglang.service_autotune#module:window_restore_after)).
    type: int
attributes:
  check_mode:
    support: full
    description: Reads the units' states and says what it would run, running nothing.
  diff_mode:
    support: none
    description: Nothing is written to diff.
seealso:
  - module: ddtree.sglang.service_autotune
"""

EXAMPLES = r"""
- name: Stop coder for its grid, a restore armed on the host
  ddtree.sglang.service_autotune_window:
    service: coder
    state: stopped
    restore_after: 5400
  register: coder_window

- name: Start coder again and disarm the restore
  ddtree.sglang.service_autotune_window:
    service: coder
    state: started
  when: coder_window.serving | default(false)
"""

RETURN = r"""
serving:
  description: With O(state=stopped) - whether the service served (or its restore was armed), so was stopped and has
    to be started again.
  returned: always
  type: bool
  sample: true
commands:
  description: The commands run (in check mode, that would run).
  returned: always
  type: list
  elements: str
  sample: ["systemctl stop sglang-coder.service"]
"""

import shlex

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.autotune_trials import (
    window_start_commands,
    window_stop_commands,
    window_units,
)


def command_line(argv: list) -> str:
    return " ".join(shlex.quote(arg) for arg in argv)


def active(module: AnsibleModule, unit: str) -> bool:
    rc, out, err = module.run_command(["systemctl", "show", "--property=ActiveState", "--value", unit])
    if rc != 0:
        module.fail_json(msg="cannot read the state of %s: %s" % (unit, (err or out).strip()), serving=False)
    return out.strip() == "active"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            service=dict(type="str", required=True),
            state=dict(type="str", required=True, choices=["stopped", "started"]),
            restore_after=dict(type="int"),
        ),
        required_if=[("state", "stopped", ["restore_after"])],
        supports_check_mode=True,
    )
    service, units = module.params["service"], window_units(module.params["service"])
    unit_active, restore_active = active(module, units["unit"]), active(module, units["restore"] + ".timer")
    if module.params["state"] == "stopped":
        if module.params["restore_after"] < 1:
            module.fail_json(
                msg="%s: restore_after is %s; it must be at least 1 s" % (service, module.params["restore_after"])
            )
        plan = window_stop_commands(service, unit_active, restore_active, module.params["restore_after"])
    else:
        plan = {"serving": unit_active, "commands": window_start_commands(service, unit_active, restore_active)}
    result = dict(changed=bool(plan["commands"]), serving=plan["serving"], commands=[])
    for argv in plan["commands"]:
        result["commands"].append(command_line(argv))
        if module.check_mode:
            continue
        rc, out, err = module.run_command(argv)
        if rc == 0:
            continue
        message = "%s: %s failed: %s" % (service, command_line(argv), (err or out).strip())
        if module.params["state"] == "started" and argv[1] == "stop":
            # The restore fired meanwhile, or its timer is gone: starting the service is what matters.
            module.warn(message)
            continue
        module.fail_json(msg=message, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
