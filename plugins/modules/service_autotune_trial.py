#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_autotune_trial
short_description: Run one setting of a tuned SGLang service on a temporary instance, measure it, and remove it
version_added: 0.2.0
description:
  - One entry of M(ddtree.sglang.service_autotune)'s C(trials) (docs/autotune.md, "Where it measures") - writes the
    temporary instance's files where the services' own live (its unit, environment, API key, state directory, and
    its service directory with a C(current) link naming the release the setting runs on), starts it, measures it
    as M(ddtree.sglang.service_autotune_measure) does, then stops it and removes every file it wrote, also when a
    step failed.
  - The unit and the environment come rendered from the services' own templates (the role passes them through
    the C(ansible.builtin.template) lookup), so the instance starts exactly as the service would.
  - A setting whose server exits at start, is not ready within O(trial.start_timeout), or fails a request is returned as
    failed measurements (C(error) set), not as a failed task. A file or unit that cannot be written or started
    fails the task, after the instance is removed.
  - The files and commands are chosen by plain functions in C(plugins/module_utils/autotune_trials.py), the
    measuring by C(plugins/module_utils/autotune_measure.py).
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  trial:
    description:
      - The entry of M(ddtree.sglang.service_autotune)'s C(trials) to run - its C(instance) (the temporary instance's
        plan entry, C(<service>-autotune), whose C(name), C(unit), C(port) and C(host) it runs under; a wildcard
        C(host) is reached through loopback), C(release_dir) (the release the setting runs on; the instance's
        C(current) link names it), C(setting), C(concurrency) (each measured, lowest first) and C(start_timeout)
        (seconds to wait for the server to answer C(GET /health) with 200).
    type: dict
    required: true
    suboptions:
      label: {description: The setting's name in the tuning's output., type: str}
      instance: {description: The temporary instance's plan entry., type: dict, required: true}
      release_dir: {description: The release the setting runs on., type: path, required: true}
      setting:
        description: The setting the instance runs.
        type: dict
        required: true
        suboptions:
          algorithm: {description: "DFLASH or DDTREE (or NONE: reported, never chosen)", type: str, required: true,
                      choices: [DFLASH, DDTREE, NONE]}
          budget: {description: DDTREE's budget, type: int}
          top_k: {description: DDTREE's top-k, type: int}
      concurrency: {description: The declared concurrencies., type: list, elements: int, required: true}
      start_timeout: {description: Seconds to wait for C(/health)., type: float, default: 900}
  services_root:
    description: The directory of the services' own directories; the instance's is C(<services_root>/<name>).
    type: path
    required: true
  config_dir:
    description: The directory of the services' environment and API key files (it exists; the role creates it).
    type: path
    required: true
  state_root:
    description: The directory of the services' state directories; the instance's is C(<state_root>/<name>).
    type: path
    required: true
  systemd_dir:
    description: Where the instance's unit is written.
    type: path
    default: /etc/systemd/system
  owner:
    description: The services' account, which owns the instance's state directory.
    type: str
    required: true
  group:
    description: The services' group.
    type: str
    required: true
  unit_file:
    description: The instance's unit, rendered from the services' unit template.
    type: str
    required: true
  environment_file:
    description: The instance's environment file, rendered from the services' environment template (it may hold
      tokens, so it is written root's alone and never logged).
    type: str
    required: true
  api_key:
    description: The service's API key, when it has one (written root's alone; the unit reads it as the server's
      standard input). Without it, no key file is left.
    type: str
extends_documentation_fragment:
  - ddtree.sglang.autotune_workload
attributes:
  check_mode:
    support: full
    description: Says which files and commands it would write and run, and measures nothing.
  diff_mode:
    support: none
    description: Nothing is left behind to diff.
seealso:
  - module: ddtree.sglang.service_autotune
  - module: ddtree.sglang.service_autotune_measure
"""

EXAMPLES = r"""
- name: Run and measure DDTREE budget 8 top_k 4 on coder's temporary instance
  ddtree.sglang.service_autotune_trial:
    trial:
      label: DDTREE b8 k4
      instance: {name: coder-autotune, unit: sglang-coder-autotune.service, host: 127.0.0.1, port: 30100}
      release_dir: /opt/sglang/releases/0a1b2c3d
      setting: {algorithm: DDTREE, budget: 8, top_k: 4}
      concurrency: [1, 16]
      start_timeout: 900
    services_root: /opt/sglang/services
    config_dir: /etc/sglang
    state_root: /var/lib/sglang
    owner: sglang
    group: sglang
    unit_file: "{{ lookup('ansible.builtin.template', 'sglang.service.j2', template_vars=coder_trial_vars) }}"
    environment_file: "{{ lookup('ansible.builtin.template', 'sglang.env.j2', template_vars=coder_trial_vars) }}"
  register: coder_b8
"""

RETURN = r"""
measurements:
  description:
    - One per declared concurrency, in the shape M(ddtree.sglang.service_autotune) takes (as
      M(ddtree.sglang.service_autotune_measure) returns them). Empty in check mode.
  returned: always
  type: list
  elements: dict
  sample: [{algorithm: DDTREE, budget: 8, top_k: 4, concurrency: 1, tokens_per_second: 161.0, accept_length: 6.3,
            error: null, requests: 8, completion_tokens: 1024, seconds: 6.36}]
ready_s:
  description: Seconds from the start until the server answered C(GET /health) with 200 (null when it never did).
  returned: always
  type: float
  sample: 41.2
workload:
  description: What was sent (prompt set name, C(max_tokens), C(warmup), rounds per slot), as the tuning key records it.
  returned: always
  type: dict
  sample: {prompts: autotune-v1, max_tokens: 128, warmup: 1, rounds: 2}
files:
  description: The files the instance was run with (all removed afterwards).
  returned: always
  type: dict
  sample: {unit: /etc/systemd/system/sglang-coder-autotune.service, environment: /etc/sglang/coder-autotune.env,
           api_key: /etc/sglang/coder-autotune.api-key, unit_dir: /opt/sglang/services/coder-autotune,
           state_dir: /var/lib/sglang/coder-autotune}
"""

import grp
import os
import pwd
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.autotune_measure import (
    SETTING_OPTIONS,
    WORKLOAD_ARGUMENT_SPEC,
    measure_instance,
    workload,
    workload_problem,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.autotune_trials import (
    trial_files,
    trial_params,
    trial_start_commands,
    trial_stop_commands,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.gate_options import default as gate_default
from ansible_collections.ddtree.sglang.plugins.module_utils.health_gate import ServiceIO


class TrialError(Exception):
    """A file or command of the instance that failed: the task fails, after the instance is removed."""


def write(path: str, content: str, mode: int) -> None:
    """Write a file whole (a reader never sees half of one), root's, with `mode`."""
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".%s." % os.path.basename(path))
    with os.fdopen(handle, "w") as out:
        out.write(content)
    os.chmod(temporary, mode)
    os.replace(temporary, path)


def set_up(params: dict, files: dict) -> None:
    """The instance's files, as units.yml writes the services' own."""
    os.makedirs(files["unit_dir"], mode=0o755, exist_ok=True)
    link = os.path.join(files["unit_dir"], "current")
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(params["release_dir"], link)
    os.makedirs(files["state_dir"], mode=0o750, exist_ok=True)
    os.chmod(files["state_dir"], 0o750)
    os.chown(files["state_dir"], pwd.getpwnam(params["owner"]).pw_uid, grp.getgrnam(params["group"]).gr_gid)
    write(files["environment"], params["environment_file"], 0o600)
    if params["api_key"]:
        write(files["api_key"], params["api_key"] + "\n", 0o600)
    elif os.path.lexists(files["api_key"]):
        os.unlink(files["api_key"])
    write(files["unit"], params["unit_file"], 0o644)


def remove(files: dict) -> list:
    """Every file of the instance removed -> the problems (each a line), none when all went."""
    problems = []
    for path in files.values():
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.unlink(path)
        except OSError as error:
            problems.append("cannot remove %s: %s" % (path, error))
    return problems


ARGUMENT_SPEC = dict(
    trial=dict(
        type="dict",
        required=True,
        options=dict(
            label=dict(type="str"),
            instance=dict(type="dict", required=True),
            release_dir=dict(type="path", required=True),
            setting=dict(type="dict", required=True, options=SETTING_OPTIONS),
            concurrency=dict(type="list", elements="int", required=True),
            start_timeout=dict(type="float", default=gate_default("start_timeout")),
        ),
    ),
    services_root=dict(type="path", required=True),
    config_dir=dict(type="path", required=True),
    state_root=dict(type="path", required=True),
    systemd_dir=dict(type="path", default="/etc/systemd/system"),
    owner=dict(type="str", required=True),
    group=dict(type="str", required=True),
    unit_file=dict(type="str", required=True),
    environment_file=dict(type="str", required=True, no_log=True),
    api_key=dict(type="str", no_log=True),
    **WORKLOAD_ARGUMENT_SPEC,
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        params = dict(module.params, **trial_params(module.params["trial"]))
    except ValueError as error:
        module.fail_json(msg=str(error))
    name = params["name"]
    problem = workload_problem(params)
    if problem:
        module.fail_json(msg="%s: %s" % (name, problem))
    files = trial_files(
        name, params["unit"], params["services_root"], params["config_dir"], params["state_root"], params["systemd_dir"]
    )
    result = dict(changed=True, measurements=[], ready_s=None, files=files)
    result["workload"] = workload(params["max_tokens"], params["warmup"])
    if module.check_mode:
        module.exit_json(**result)
    problem = _run_trial(module, params, files, result)
    if problem:
        module.fail_json(msg=problem, **result)
    module.exit_json(**result)


def _run_trial(module, params: dict, files: dict, result: dict) -> str | None:
    """Start the temporary instance, measure it into result, and stop and remove it whatever happened.
    -> what went wrong, or None."""
    name = params["name"]
    systemctl = module.get_bin_path("systemctl", required=True)

    def run(argv: list, check: bool = True) -> None:
        rc, out, err = module.run_command([systemctl] + argv[1:])
        if rc != 0 and check:
            raise TrialError("%s: %s failed: %s" % (name, " ".join(argv), (err or out).strip()))

    def unit_state() -> str:
        _rc, out, _err = module.run_command([systemctl, "is-active", params["unit"]])
        return out.strip()

    setting = {key: params["setting"][key] for key in ("algorithm", "budget", "top_k")}
    problem = None
    try:
        set_up(params, files)
        for argv in trial_start_commands(params["unit"]):
            run(argv)
        io = ServiceIO(
            module.run_command,
            systemctl,
            module.get_bin_path("journalctl", required=True),
            params["unit"],
            params["host"],
            params["port"],
            api_key=params["api_key"],
        )
        result.update(
            measure_instance(
                io.request,
                unit_state,
                setting,
                params["concurrency"],
                params["max_tokens"],
                params["warmup"],
                params["start_timeout"],
                params["request_timeout"],
            )
        )
    except (OSError, KeyError, TrialError) as error:
        problem = str(error) if isinstance(error, TrialError) else "%s: %s" % (name, error)
    finally:
        # Stopped whatever happened, its files removed, and systemd told to forget its unit.
        stop, forget = trial_stop_commands(params["unit"])
        run(stop, check=False)
        for line in remove(files):
            module.warn("%s: %s" % (name, line))
        run(forget, check=False)
    return problem


if __name__ == "__main__":
    main()
