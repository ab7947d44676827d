#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU facts with nvidia-smi
version_added: 0.1.0
description:
  - Runs C(nvidia-smi) three times (C(--query-gpu), C(--query-compute-apps), C(--version)) and
    returns per-GPU facts, the driver and CUDA versions, and the processes holding each GPU.
  - Each process is tagged with the systemd service it runs in (read from C(/proc/<pid>/cgroup)),
    so callers can tell their own services from foreign processes.
  - Fails, with the command and its output, when nvidia-smi is missing, exits non-zero, or prints
    something the parser does not understand.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  nvidia_smi:
    description:
      - Name or path of the nvidia-smi executable. A bare name is looked up on C(PATH) and in
        C(/usr/bin) and C(/usr/local/bin).
    type: str
    default: nvidia-smi
extends_documentation_fragment:
  - ddtree.sglang.attributes.read_only
  - ddtree.sglang.attributes.facts
notes:
  - The exact queries are listed in C(plugins/module_utils/nvidia_smi.py); the lab's nvidia-smi
    answers the same ones.
seealso:
  - module: ddtree.sglang.host_facts
"""

EXAMPLES = r"""
- name: Gather GPU facts
  ddtree.sglang.gpu_facts:

- name: Show the GPUs
  ansible.builtin.debug:
    msg: "{{ ansible_facts.ddtree_gpu.gpus | map(attribute='name') | list }}"

- name: Use an nvidia-smi outside PATH
  ddtree.sglang.gpu_facts:
    nvidia_smi: /opt/nvidia/bin/nvidia-smi
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: success
  type: dict
  contains:
    ddtree_gpu:
      description: The GPU inventory.
      type: dict
      contains:
        driver_version:
          description: NVIDIA driver version.
          type: str
          sample: 580.159.04
        cuda_version:
          description: Highest CUDA version the driver supports.
          type: str
          sample: "13.0"
        gpu_count:
          description: Number of GPUs.
          type: int
          sample: 8
        gpus:
          description: One entry per GPU, in nvidia-smi index order.
          type: list
          elements: dict
          sample:
            - index: 0
              name: NVIDIA RTX PRO 6000 Blackwell Workstation Edition
              uuid: GPU-8f7c2b1e-0000-4000-8000-000000000000
              pci_bus_id: "00000000:01:00.0"
              driver_version: 580.159.04
              compute_capability: "12.0"
              sm: 120
              memory_total_mib: 97887
              memory_used_mib: 0
              memory_free_mib: 97250
              persistence_mode: true
              temperature_c: 31
              power_draw_w: 14.87
              utilization_pct: 0.0
              processes: []
        summary:
          description: The inventory as lines for people to read.
          type: list
          elements: str
          sample:
            - driver 580.159.04, CUDA 13.0, 8 GPU(s)
            - "GPU 0: NVIDIA RTX PRO 6000 Blackwell Workstation Edition, sm_120, 97250 of 97887 MiB free, idle"
        processes:
          description:
            - Compute processes on any GPU, with C(gpu_index) and the systemd C(unit) they run in
              (null when in none or unreadable).
          type: list
          elements: dict
          sample:
            - pid: 498
              name: python3
              used_memory_mib: 8148
              gpu_uuid: GPU-00000000-1111-2222-3333-444444444444
              gpu_index: 0
              unit: sglang-coder.service
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.nvidia_smi import (
    NvidiaSmiParseError,
    apps_query_args,
    gpu_facts,
    gpu_query_args,
    systemd_unit_from_cgroup,
)


def unit_of_pid(pid):
    try:
        with open("/proc/%d/cgroup" % pid) as handle:
            return systemd_unit_from_cgroup(handle.read())
    except OSError:
        return None


def run_nvidia_smi(module, binary, args):
    command = [binary] + args
    rc, stdout, stderr = module.run_command(command)
    if rc != 0:
        module.fail_json(
            msg="%s exited with %d: %s" % (" ".join(command), rc, (stderr or stdout).strip()[:500]),
            cmd=command,
            rc=rc,
            stdout=stdout,
            stderr=stderr,
        )
    return stdout


def main():
    module = AnsibleModule(
        argument_spec=dict(nvidia_smi=dict(type="str", default="nvidia-smi")),
        supports_check_mode=True,
    )
    binary = module.params["nvidia_smi"]
    if os.path.sep not in binary:
        found = module.get_bin_path(binary, opt_dirs=["/usr/bin", "/usr/local/bin"])
        if not found:
            module.fail_json(
                msg="nvidia-smi not found: %r is not on PATH, /usr/bin or /usr/local/bin; is the NVIDIA driver "
                "installed? "
                "Set nvidia_smi to its path if it is elsewhere." % binary
            )
        binary = found
    elif not os.access(binary, os.X_OK):
        module.fail_json(msg="nvidia-smi not found: %s is missing or not executable" % binary)

    outputs = {
        "gpus": run_nvidia_smi(module, binary, gpu_query_args()),
        "apps": run_nvidia_smi(module, binary, apps_query_args()),
        "version": run_nvidia_smi(module, binary, ["--version"]),
    }
    try:
        facts = gpu_facts(outputs["gpus"], outputs["apps"], outputs["version"], unit_of_pid=unit_of_pid)
    except NvidiaSmiParseError as error:
        module.fail_json(msg="could not parse the output of %s: %s" % (binary, error), outputs=outputs)
    module.exit_json(changed=False, ansible_facts={"ddtree_gpu": facts})


if __name__ == "__main__":
    main()
