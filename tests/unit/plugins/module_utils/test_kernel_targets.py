"""The GPUs the overlay's kernels are compiled for (module_utils/kernel_targets.py): the resource check the kernel
stage applies, and the preflight rule for DDTREE services on GPUs outside that list."""

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils import kernel_targets

BLACKWELL = [
    {"index": index, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "compute_capability": "12.0"}
    for index in range(8)
]
L40S = [{"index": index, "name": "NVIDIA L40S", "compute_capability": "8.9"} for index in range(4)]
CODER = {"name": "coder", "gpus": [0, 1], "speculative": {"algorithm": "DDTREE", "budget": 15, "top_k": 8}}
CHAT = {"name": "chat", "gpus": [2], "speculative": {"algorithm": "NEXTN"}}


def test_the_compiled_capabilities_are_the_inventories_gpus_and_the_test_gpu_in_numeric_order():
    assert kernel_targets.kernel_capabilities() == ["8.6", "9.0", "12.0"]
    assert [kernel_targets.capability_number(cc) for cc in kernel_targets.kernel_capabilities()] == [86, 90, 120]


def test_registers_per_block_round_each_warp_up_to_the_allocation_unit():
    assert kernel_targets.registers_per_block(255, 8) == 256 * 32 * 8
    assert kernel_targets.registers_per_block(70, 2) == 72 * 32 * 2
    assert kernel_targets.registers_per_block(64, 1) == 64 * 32


def test_a_kernel_within_every_limit_has_no_problem():
    assert kernel_targets.resource_problems("tree_build", "12.0", 101376, 255, 8) == []


@pytest.mark.parametrize(
    "capability, shared, registers, warps, message",
    [
        (
            "12.0",
            101377,
            40,
            4,
            "tree_attention on compute capability 12.0: 101377 bytes of shared memory per block, over the GPU's 101376",
        ),
        (
            "8.6",
            200000,
            40,
            4,
            "tree_attention on compute capability 8.6: 200000 bytes of shared memory per block, over the GPU's 101376",
        ),
        (
            "9.0",
            300000,
            40,
            4,
            "tree_attention on compute capability 9.0: 300000 bytes of shared memory per block, over the GPU's 232448",
        ),
        ("9.0", 0, 256, 1, "tree_attention on compute capability 9.0: 256 registers per thread, over the GPU's 255"),
        (
            "9.0",
            0,
            255,
            16,
            "tree_attention on compute capability 9.0: 131072 registers per block (255 per thread x 16 warps), over the GPU's 65536",
        ),
        (
            "7.5",
            0,
            40,
            4,
            "tree_attention: no limits are declared for compute capability 7.5; add its row to KERNEL_GPUS",
        ),
    ],
)
def test_each_resource_over_its_limit_names_the_kernel_the_gpu_and_the_resource(
    capability, shared, registers, warps, message
):
    problems = kernel_targets.resource_problems("tree_attention", capability, shared, registers, warps)
    assert any(message in problem for problem in problems), problems


def test_sm90_takes_more_shared_memory_than_sm86_and_sm120():
    assert kernel_targets.resource_problems("k", "9.0", 200000, 40, 4) == []
    assert kernel_targets.resource_problems("k", "8.6", 200000, 40, 4) and kernel_targets.resource_problems(
        "k", "12.0", 200000, 40, 4
    )


def test_ddtree_on_gpus_the_kernels_are_compiled_for_passes():
    assert kernel_targets.ddtree_gpu_problems([CODER, CHAT], BLACKWELL, "ct200") == []


def test_ddtree_on_a_gpu_without_kernels_is_refused_naming_host_service_gpu_and_fix():
    problems = kernel_targets.ddtree_gpu_problems([CODER], L40S, "ct300")
    assert problems[0] == (
        "ct300: service coder runs DDTREE on GPU 0 (NVIDIA L40S, compute capability 8.9), but the overlay's kernels are compiled "
        "and checked only for compute capabilities 8.6, 9.0, 12.0; run the service with DFLASH on this host, or add 8.9 to "
        "KERNEL_GPUS in plugins/module_utils/kernel_targets.py (with that GPU's limits) and pass scripts/test kernels"
    )
    assert len(problems) == 2  # GPU 0 and GPU 1


@pytest.mark.parametrize("algorithm", ["NEXTN", "DFLASH", "NONE", "EAGLE"])
def test_other_algorithms_run_no_overlay_kernel_and_pass_anywhere(algorithm):
    assert kernel_targets.ddtree_gpu_problems([dict(CHAT, speculative={"algorithm": algorithm})], L40S, "ct300") == []
    assert kernel_targets.ddtree_gpu_problems([{"name": "plain", "gpus": [0]}], L40S, "ct300") == []


def test_a_tuned_service_is_checked_on_the_spare_gpus_its_trials_run_on():
    mixed = BLACKWELL[:2] + [dict(gpu, index=2 + gpu["index"]) for gpu in L40S[:2]]
    tuned = {
        "name": "coder",
        "gpus": [0, 1],
        "speculative": {"algorithm": "DDTREE", "autotune": {"gpus": [2, 3], "port": 30100}},
    }
    problems = kernel_targets.ddtree_gpu_problems([tuned], mixed, "ct300")
    assert [problem.split(" (")[0] for problem in problems] == [
        "ct300: service coder runs DDTREE on GPU 2",
        "ct300: service coder runs DDTREE on GPU 3",
    ]


def test_a_gpu_index_the_host_lacks_is_left_to_the_gpu_existence_check():
    assert kernel_targets.ddtree_gpu_problems([dict(CODER, gpus=[9])], L40S, "ct300") == []
