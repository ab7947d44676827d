"""Stack ABI rules, from recorded facts: every contradiction stack_verify must catch, and none on a good stack."""

import copy
import json
import subprocess
import sys

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils import stack

# Recorded on the H200 machine (torch 2.11.0+cu130) and shaped like the cu130 pin set.
GPU_FACTS = {
    "python": "3.11.2",
    "packages": {
        "torch": "2.14.1",
        "sglang": "0.5.23",
        "sglang-kernel": "0.4.10",
        "flashinfer-python": "0.7.2",
        "triton": "3.6.0",
        "torchcodec": "0.17.0",
        "transformers": "5.19.0",
    },
    "torch": {
        "version": "2.14.1+cu130",
        "cuda": "13.0",
        "cuda_available": True,
        "device_count": 8,
        "arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"],
        "capabilities": ["12.0"] * 8,
        "error": None,
    },
    "imports": {"sgl_kernel": {"ok": True, "error": None}, "torchcodec": {"ok": True, "error": None}},
    "nvcc": {"path": "/opt/sglang/stacks/x/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc", "version": "13.0"},
}
CU130 = {
    "python": "3.11",
    "gpu": True,
    "torch": "2.14.1",
    "torch_cuda": "13.0",
    "nvcc": "13.0",
    "packages": {"sglang": "0.5.23", "sglang-kernel": "0.4.10", "torchcodec": "0.17.0"},
    "imports": ["sgl_kernel", "torchcodec"],
}
CT200 = {"gpu_capabilities": ["12.0"] * 8, "driver_cuda_version": "13.0"}

LAB_FACTS = {
    "python": "3.11.2",
    "packages": {
        "torch": "2.13.0+cpu",
        "sglang": "0.5.23",
        "triton": "3.6.0",
        "sglang-kernel": None,
        "torchcodec": None,
    },
    "torch": {
        "version": "2.13.0+cpu",
        "cuda": None,
        "cuda_available": False,
        "device_count": 0,
        "arch_list": [],
        "capabilities": [],
        "error": None,
    },
    "imports": {"sglang.srt.server_args": {"ok": True, "error": None}},
    "nvcc": None,
}
LAB_CPU = {
    "python": "3.11",
    "gpu": False,
    "torch": "2.13.0",
    "torch_cuda": None,
    "packages": {"sglang": "0.5.23", "triton": "3.6.0"},
    "imports": ["sglang.srt.server_args"],
}


def changed(facts, path, value):
    facts = copy.deepcopy(facts)
    target = facts
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return facts


def test_good_gpu_stack_has_no_contradictions():
    assert stack.stack_contradictions(GPU_FACTS, CU130, CT200) == []


def test_lab_cpu_stack_is_checked_without_gpu_claims():
    assert (
        stack.stack_contradictions(
            LAB_FACTS, LAB_CPU, {"gpu_capabilities": ["12.0"] * 8, "driver_cuda_version": "13.0"}
        )
        == []
    )


@pytest.mark.parametrize(
    "facts, expected, host, message",
    [
        (
            changed(GPU_FACTS, ["torch", "cuda"], "12.8"),
            CU130,
            CT200,
            "torch 2.14.1+cu130 is a CUDA 12.8 build; the pin set needs CUDA 13.0",
        ),
        (changed(GPU_FACTS, ["torch", "cuda"], None), CU130, CT200, "is a CPU build; the pin set needs CUDA 13.0"),
        (GPU_FACTS, dict(CU130, torch_cuda="12.8"), CT200, "is a CUDA 13.0 build; the pin set needs CUDA 12.8"),
        (changed(LAB_FACTS, ["torch", "cuda"], "13.0"), LAB_CPU, None, "is a CUDA 13.0 build; the pin set is CPU-only"),
        (
            changed(GPU_FACTS, ["torch", "arch_list"], ["sm_80", "sm_90", "sm_100"]),
            CU130,
            CT200,
            "GPU 0 has compute capability 12.0 (sm_120), which torch 2.14.1+cu130's arch list sm_80 sm_90 sm_100 cannot run",
        ),
        (
            changed(
                GPU_FACTS,
                ["imports", "sgl_kernel"],
                {"ok": False, "error": "OSError: libcudart.so.13: cannot open shared object file"},
            ),
            CU130,
            CT200,
            "sgl_kernel cannot load: OSError: libcudart.so.13",
        ),
        (
            changed(
                GPU_FACTS,
                ["imports", "torchcodec"],
                {"ok": False, "error": "RuntimeError: Could not load libtorchcodec"},
            ),
            CU130,
            CT200,
            "torchcodec cannot load: RuntimeError: Could not load libtorchcodec (torchcodec needs one complete FFmpeg",
        ),
        (
            GPU_FACTS,
            CU130,
            dict(CT200, driver_cuda_version="12.8"),
            "the driver supports CUDA 12.8, older than the CUDA 13.0",
        ),
        (changed(GPU_FACTS, ["torch", "cuda_available"], False), CU130, CT200, "sees no GPU"),
        (changed(GPU_FACTS, ["torch", "device_count"], 4), CU130, CT200, "torch sees 4 GPU(s), nvidia-smi lists 8"),
        (
            changed(GPU_FACTS, ["packages", "sglang"], "0.5.10"),
            CU130,
            CT200,
            "sglang 0.5.10 in the stack, the pin set has 0.5.23",
        ),
        (
            changed(GPU_FACTS, ["packages", "sglang-kernel"], None),
            CU130,
            CT200,
            "sglang-kernel is not installed; the pin set has 0.4.10",
        ),
        (
            changed(GPU_FACTS, ["torch", "version"], "2.13.0+cu130"),
            CU130,
            CT200,
            "torch 2.13.0+cu130 in the stack, the pin set has 2.14.1",
        ),
        (
            changed(GPU_FACTS, ["python"], "3.12.3"),
            CU130,
            CT200,
            "python 3.12.3 in the stack, the pin set is locked for 3.11",
        ),
        (changed(GPU_FACTS, ["nvcc"], None), CU130, CT200, "nvcc not found"),
        (changed(GPU_FACTS, ["nvcc", "version"], "12.8"), CU130, CT200, "nvcc 12.8"),
        (
            changed(GPU_FACTS, ["torch"], {"error": "ImportError: libcudnn.so.9"}),
            CU130,
            CT200,
            "torch does not import: ImportError: libcudnn.so.9",
        ),
    ],
)
def test_each_contradiction_names_both_sides(facts, expected, host, message):
    problems = stack.stack_contradictions(facts, expected, host)
    assert any(message in problem for problem in problems), problems


@pytest.mark.parametrize(
    "arch_list, capability, runs",
    [
        (["sm_80"], "8.6", True),  # sm_80 code runs on an A6000
        (["sm_80"], "9.0", False),  # but not on another major
        (["sm_90"], "8.6", False),
        (["sm_120"], "12.0", True),
        (["sm_100"], "12.0", False),
        (["compute_90"], "12.0", True),  # PTX is JIT-compiled forward
        (["compute_120"], "9.0", False),
        (["sm_90a"], "9.0", True),
    ],
)
def test_arch_runs_capability(arch_list, capability, runs):
    assert stack.arch_runs_capability(arch_list, capability) is runs


def test_probe_runs_without_torch_and_reports_imports():
    out = subprocess.run(
        [sys.executable, "-c", stack.PROBE_SOURCE, json.dumps(["json", "no_such_module_xyz"])],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    facts = json.loads(out)
    assert facts["python"] == "%d.%d.%d" % sys.version_info[:3]
    assert facts["imports"]["json"] == {"ok": True, "error": None}
    assert facts["imports"]["no_such_module_xyz"]["ok"] is False
    assert "ModuleNotFoundError" in facts["imports"]["no_such_module_xyz"]["error"]
    assert set(facts["packages"]) >= {"torch", "sglang", "sglang-kernel", "torchcodec"}
    assert "torch" in facts
