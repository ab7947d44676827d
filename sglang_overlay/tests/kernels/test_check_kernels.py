"""scripts/check_kernels.py, the `kernels` stage of scripts/test: which GPUs and launches it compiles, how it
reads ptxas, and that every Triton kernel of the overlay is among its launches (a new kernel without a case fails
here). The compiles themselves are the stage's (minutes cold): not repeated here."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

OVERLAY = Path(__file__).resolve().parents[2]
REPO = OVERLAY.parent
SCRIPT = OVERLAY / "scripts" / "check_kernels.py"
KERNEL_MODULES = ("tree_build", "draft_topk", "tree_attention", "full_mask", "kv_move", "accept_path")


def load_script():
    spec = importlib.util.spec_from_file_location("check_kernels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = load_script()

PTXAS_LOG = """ptxas info    : 11 bytes gmem
ptxas info    : Compiling entry function '_tree_verify_attn_kernel' for 'sm_86'
ptxas info    : Function properties for _tree_verify_attn_kernel
    160 bytes stack frame, 156 bytes spill stores, 156 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 160 bytes cumulative stack size
"""


def test_ptxas_report_gives_registers_and_spills():
    assert check.parse_ptxas_log(PTXAS_LOG) == {
        "registers": 255,
        "stack_bytes": 160,
        "spill_store_bytes": 156,
        "spill_load_bytes": 156,
    }
    assert check.parse_ptxas_log("") is None


def test_the_gpus_are_the_declared_list_and_the_inventories():
    targets = check.load_kernel_targets(str(REPO))
    declared = check.inventory_capabilities(str(REPO))
    assert set(declared) == {"8.6", "12.0"}  # the lab's group files are the example's: read once
    assert set(declared) <= set(targets.KERNEL_GPUS)
    assert declared["12.0"] == ["inventories/example/group_vars/blackwell.yml"]


def test_every_inventory_model_has_a_shape():
    models = check.inventory_models(str(REPO))
    assert {model["model"] for model in models} == {"Qwen3-Coder-30B-A3B-Instruct", "GLM-4.5-Air"}
    assert all(model["model"] in check.MODEL_SHAPES for model in models)


def test_kv_copy_config_is_sglangs_rule():
    assert check.kv_copy_config(512) == {"bytes_per_tile": 128, "byte_tiles": 4, "num_warps": 4}
    assert check.kv_copy_config(4096) == {"bytes_per_tile": 256, "byte_tiles": 16, "num_warps": 4}
    assert check.kv_copy_config(16384) == {"bytes_per_tile": 512, "byte_tiles": 32, "num_warps": 8}


def fake_repo(tmp_path, capability="8.9", model="/models/Mystery-7B"):
    (tmp_path / "plugins" / "module_utils").mkdir(parents=True)
    (tmp_path / "plugins" / "module_utils" / "kernel_targets.py").write_text(
        (REPO / "plugins" / "module_utils" / "kernel_targets.py").read_text()
    )
    (tmp_path / "inventories" / "mine" / "group_vars").mkdir(parents=True)
    (tmp_path / "inventories" / "mine" / "group_vars" / "ada.yml").write_text(
        'preflight_compute_capabilities: ["%s"]\nsglang_services:\n  - {name: x, model_path: %s, gpus: [0], port: 1}\n'
        % (capability, model)
    )
    return tmp_path


def run(*args, env=None):
    environ = dict(os.environ, PYTHONPATH=str(OVERLAY / "src"), **(env or {}))
    environ.pop("TRITON_INTERPRET", None)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=environ, timeout=600
    )


def test_an_inventory_gpu_or_model_without_a_row_fails_naming_it(tmp_path):
    repo = fake_repo(tmp_path)
    result = run("--repo", str(repo), "--report", str(tmp_path / "report.json"))
    assert result.returncode == 2, result.stderr
    assert (
        "error: inventories/mine/group_vars/ada.yml declares compute capability 8.9, which KERNEL_GPUS "
        "(plugins/module_utils/kernel_targets.py) has no row for"
    ) in result.stderr
    assert "error: inventories/mine/group_vars/ada.yml: model Mystery-7B has no row in MODEL_SHAPES" in result.stderr
    assert not (tmp_path / "report.json").exists()


def test_every_overlay_kernel_is_launched_with_the_wrappers_own_settings():
    # A process of its own: the suite runs Triton's interpreter, whose kernels are not JITFunctions.
    result = run("--repo", str(REPO), "--report", os.devnull, "--list")
    assert result.returncode == 0, result.stderr
    launched = {line.split("\t")[1] for line in result.stdout.splitlines()}
    sources = "\n".join(
        (OVERLAY / "src" / "sglang_overlay" / "kernels" / (name + ".py")).read_text() for name in KERNEL_MODULES
    )
    kernels = set(re.findall(r"@triton\.jit(?:\([^)]*\))?\n\s+def (_\w+_kernel)\(", sources))
    assert kernels == {
        "_ddtree_build_kernel",
        "_chunk_topk_kernel",
        "_span_topk_kernel",
        "_merge_topk_kernel",
        "_tree_verify_attn_kernel",
        "_full_mask_kernel",
        "_move_path_kv_kernel",
        "_accept_path_kernel",
    }
    assert launched == kernels
    lines = result.stdout.splitlines()
    assert "tree_build\t_ddtree_build_kernel\tbudget 512 L32 K64\tnum_warps=4\t8.6,9.0,12.0" in lines
    assert any(
        line.startswith("tree_attention\t_tree_verify_attn_kernel\tQwen3-Coder-30B-A3B-Instruct/tp2 16q/2kv d128 W16")
        for line in lines
    )


def test_the_tree_attention_runs_each_gpus_own_tile():
    result = run("--repo", str(REPO), "--report", os.devnull, "--list")
    assert result.returncode == 0, result.stderr
    gpus = {
        tuple(line.split("\t")[2].split(" tile ")[1:]): line.split("\t")[4]
        for line in result.stdout.splitlines()
        if line.startswith("tree_attention\t") and " W16 " in line
    }
    assert gpus == {("64,64,8",): "9.0", ("32,64,8",): "8.6,12.0"}


def test_spilled_registers_fail_naming_the_kernel_the_gpu_and_the_resource():
    report = check.parse_ptxas_log(PTXAS_LOG)
    problems = check.spill_problems("tree_attention (_tree_verify_attn_kernel; W64)", "8.6", report, 255)
    assert problems == [
        "tree_attention (_tree_verify_attn_kernel; W64) on compute capability 8.6: 156 bytes of registers spilled to "
        "local memory (it needs more than the GPU's 255 registers per thread); give this GPU a smaller tile or block"
    ]
    assert check.status(problems) == "over"
    # Planted: the same kernel without spills passes.
    clean = dict(report, spill_store_bytes=0, spill_load_bytes=0, stack_bytes=0)
    assert check.spill_problems("k", "8.6", clean, 255) == [] and check.status([]) == "ok"
