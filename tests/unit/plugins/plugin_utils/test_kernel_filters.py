"""The preflight's filter ddtree.sglang.kernel_gpu_problems (plugins/filter/kernel_gpu_problems.py) is the rule of
module_utils/kernel_targets.py. Here, with the controller-side plugins' tests, for the reason
test_rollout_filters.py gives (ansible.errors imported early takes `warnings` out of the modules' results)."""

import importlib

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils.kernel_targets import ddtree_gpu_problems

L40S = [{"index": index, "name": "NVIDIA L40S", "compute_capability": "8.9"} for index in range(2)]
CODER = {"name": "coder", "gpus": [0, 1], "speculative": {"algorithm": "DDTREE", "budget": 15, "top_k": 8}}


@pytest.fixture(scope="module")
def kernel_filters():
    return importlib.import_module("ansible_collections.ddtree.sglang.plugins.filter.kernel_gpu_problems")


def test_the_filter_is_the_rule(kernel_filters):
    assert kernel_filters.kernel_gpu_problems([CODER], L40S, "ct300") == ddtree_gpu_problems([CODER], L40S, "ct300")
    assert len(kernel_filters.kernel_gpu_problems([CODER], L40S, "ct300")) == 2


def test_the_filter_refuses_what_is_not_a_list(kernel_filters):
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="sglang_services list"):
        kernel_filters.kernel_gpu_problems({"name": "coder"}, L40S)
    with pytest.raises(AnsibleFilterError, match="gpu_facts' list of GPUs"):
        kernel_filters.kernel_gpu_problems([CODER], None)
