#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: stack_verify
short_description: Prove an SGLang stack's ABI on the host it will serve from
version_added: 0.1.0
description:
  - Runs a probe with the stack's own Python and returns the stack's ABI facts - the Python version;
    torch's version and CUDA build, whether CUDA is available, the device count, torch's arch list and
    the GPUs' compute capabilities; the versions of sglang, sglang-kernel, flashinfer-python, triton,
    torchcodec and transformers; whether each expected module imports (C(sgl_kernel), C(torchcodec), ...);
    the nvcc version.
  - Fails, naming both sides, when the facts contradict the pin set or the host - a CUDA 12.8 torch
    on a CUDA 13.0 pin set, a GPU whose compute capability torch's arch list cannot run, a kernel
    package or torchcodec that cannot load, a driver older than the stack's CUDA.
  - A CPU pin set (C(expected.gpu=false)) is checked as a CPU stack, with no GPU claims.
  - The probe writes nothing (C(PYTHONDONTWRITEBYTECODE=1)), so the stack stays as built.
  - With O(state_root), records a pass on the host (C(<state_root>/_checks/stack_verify/<key>.json),
    written whole) and, on a later run with the same key, returns the recorded facts without starting
    the stack's Python (RV(recorded) true). The key is a digest of every option, the module's code and
    a fingerprint of the stack (completion marker, site-packages listing, each distribution's
    C(RECORD), the interpreter); a package installed, upgraded or removed in the stack, a new host
    Python, other GPUs or another driver CUDA version are a new key and are checked again. A failed
    check or a stack without its completion marker records nothing; check mode reads records but
    writes none.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  stack:
    description: The stack's directory (a venv), for example C(/opt/sglang/stacks/3f2a9c1d0b7e).
    type: path
    required: true
  expected:
    description:
      - What the pin set promises, usually the C(expect) section of its C(pinset.yml) plus the Python
        version the lock was made for.
      - Keys C(python), C(gpu) (bool), C(torch), C(torch_cuda) (null for CPU), C(nvcc) (optional),
        C(packages) (distribution name to version), C(imports) (modules that must import).
    type: dict
    required: true
  gpu_capabilities:
    description:
      - The host's GPUs' compute capabilities as nvidia-smi reports them (for example
        C(ansible_facts.ddtree_gpu.gpus | map(attribute='compute_capability'))). Used for GPU pin sets.
    type: list
    elements: str
    default: []
  driver_cuda_version:
    description: The CUDA version the driver supports (nvidia-smi's C(CUDA Version)). Used for GPU pin sets.
    type: str
  timeout:
    description: Seconds the probe may take (imports of large packages can be slow on a cold disk).
    type: int
    default: 600
  state_root:
    description:
      - Where passes are recorded (C(<state_root>/_checks/stack_verify/)), for example C(/var/lib/sglang).
        Unset, nothing is recorded and every run probes.
    type: path
extends_documentation_fragment:
  - ddtree.sglang.attributes.read_only
seealso:
  - module: ddtree.sglang.gpu_facts
"""

EXAMPLES = r"""
- name: Verify the cu130 stack against the host's GPUs
  ddtree.sglang.stack_verify:
    stack: /opt/sglang/stacks/3f2a9c1d0b7e
    expected:
      python: "3.11"
      gpu: true
      torch: 2.14.1
      torch_cuda: "13.0"
      nvcc: "13.0"
      packages: {sglang: 0.5.23, sglang-kernel: 0.4.10}
      imports: [sgl_kernel, torchcodec]
    gpu_capabilities: "{{ ansible_facts.ddtree_gpu.gpus | map(attribute='compute_capability') | list }}"
    driver_cuda_version: "{{ ansible_facts.ddtree_gpu.cuda_version }}"
    state_root: /var/lib/sglang
"""

RETURN = r"""
facts:
  description: The stack's ABI facts as the probe found them.
  returned: when the probe ran
  type: dict
  sample:
    python: 3.11.2
    packages: {torch: 2.14.1, sglang: 0.5.23, sglang-kernel: 0.4.10, triton: 3.6.0}
    torch: {version: 2.14.1+cu130, cuda: "13.0", cuda_available: true, device_count: 8,
            arch_list: [sm_80, sm_90, sm_100, sm_120], capabilities: ["12.0"]}
    imports: {sgl_kernel: {ok: true, error: null}}
    nvcc: {path: /opt/sglang/stacks/3f2a9c1d0b7e/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc, version: "13.0"}
contradictions:
  description: Every contradiction found; empty when the stack is proven.
  returned: always
  type: list
  elements: str
  sample: ["torch 2.14.1+cu128 is a CUDA 12.8 build; the pin set needs CUDA 13.0"]
recorded:
  description: Whether the result is a recorded pass (the probe did not run); false when it ran.
  returned: when the stack was proven
  type: bool
recorded_at:
  description: When the recorded pass was probed (UTC).
  returned: when RV(recorded) is true
  type: str
record:
  description: The record's path on the host (read, or written by this pass).
  returned: when the stack was proven, O(state_root) is set and the stack is complete
  type: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils import check_records
from ansible_collections.ddtree.sglang.plugins.module_utils.stack import PROBE_SOURCE, stack_contradictions

CHECK = "stack_verify"
# The code a recorded pass was probed with: this module and the probe and its judge.
CODE = (
    "ansible_collections.ddtree.sglang.plugins.modules.stack_verify",
    "ansible_collections.ddtree.sglang.plugins.module_utils.stack",
    "ansible_collections.ddtree.sglang.plugins.module_utils.check_records",
)


def record_slot(params):
    """Where a pass with these options on this stack is recorded (check_records.find_record)."""
    options = {name: value for name, value in params.items() if name not in ("state_root", "timeout")}
    fingerprint = check_records.stack_fingerprint(params["stack"])
    return check_records.find_record(
        params["state_root"], CHECK, CODE, dict(options, fingerprint=fingerprint), complete=bool(fingerprint["marker"])
    )


def main():
    module = AnsibleModule(
        argument_spec=dict(
            stack=dict(type="path", required=True),
            expected=dict(type="dict", required=True),
            gpu_capabilities=dict(type="list", elements="str", default=[]),
            driver_cuda_version=dict(type="str"),
            timeout=dict(type="int", default=600),
            state_root=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    stack = module.params["stack"]
    slot = record_slot(module.params)
    if slot and slot["record"]:
        module.exit_json(**check_records.recorded_result(slot))
    python = os.path.join(stack, "bin", "python")
    if not os.access(python, os.X_OK):
        module.fail_json(msg="stack %s has no executable bin/python; is it built?" % stack, contradictions=[])
    imports = module.params["expected"].get("imports") or []
    rc, stdout, stderr = module.run_command(
        ["timeout", str(module.params["timeout"]), python, "-c", PROBE_SOURCE, json.dumps(imports)],
        environ_update={"PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"},
    )
    if rc != 0:
        module.fail_json(
            msg="the probe failed in stack %s (exit %d): %s" % (stack, rc, (stderr or stdout).strip()[-800:]),
            rc=rc,
            stdout=stdout,
            stderr=stderr,
            contradictions=[],
        )
    try:
        facts = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        module.fail_json(
            msg="the probe in stack %s printed no JSON: %r" % (stack, stdout[-500:]), stderr=stderr, contradictions=[]
        )
    host = {
        "gpu_capabilities": module.params["gpu_capabilities"],
        "driver_cuda_version": module.params["driver_cuda_version"],
    }
    problems = stack_contradictions(facts, module.params["expected"], host)
    if problems:
        module.fail_json(
            msg="stack %s contradicts its pin set or this host: %s" % (stack, "; ".join(problems)),
            facts=facts,
            contradictions=problems,
        )
    result = dict(changed=False, facts=facts, contradictions=[])
    module.exit_json(recorded=False, **check_records.record_pass(slot, CHECK, result, module.check_mode))


if __name__ == "__main__":
    main()
