# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The GPUs a host's DDTREE services would run on without kernels compiled for their compute capability
(module_utils/kernel_targets.py holds the rule and the list, which scripts/test kernels compiles for)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.ddtree.sglang.plugins.module_utils.kernel_targets import ddtree_gpu_problems


def kernel_gpu_problems(services, gpus, host="host"):
    """One message per GPU of a DDTREE service whose compute capability no kernel is compiled for."""
    if not isinstance(services, list):
        raise AnsibleFilterError("kernel_gpu_problems takes the sglang_services list, got %r" % (services,))
    if not isinstance(gpus, list):
        raise AnsibleFilterError("kernel_gpu_problems: gpus must be gpu_facts' list of GPUs, got %r" % (gpus,))
    return ddtree_gpu_problems(services, gpus, host)


class FilterModule:
    def filters(self):
        return {"kernel_gpu_problems": kernel_gpu_problems}
