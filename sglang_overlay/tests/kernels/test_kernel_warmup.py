"""The AOT warm-up CLI without a GPU: the clear failure, the --allow-no-gpu no-op, and a real
cross-compilation for sm_90 (no GPU needed) that writes a cubin and a manifest."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sglang_overlay.kernels import tree_build as tb
from sglang_overlay.kernels import warmup

try:
    import torch

    HAS_GPU = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    HAS_GPU = False

no_gpu_only = pytest.mark.skipif(HAS_GPU, reason="checks the behaviour on a machine without a GPU")


def test_parse_arch():
    assert warmup.parse_arch("sm_90") == 90
    assert warmup.parse_arch("sm_90a") == 90
    assert warmup.parse_arch("9.0") == 90
    assert warmup.parse_arch(100) == 100
    for bad in ("gfx90a", "9", "sm_"):
        with pytest.raises(ValueError):
            warmup.parse_arch(bad)


@no_gpu_only
def test_no_gpu_fails_clearly(tmp_path, capsys):
    rc = warmup.main(["--arch", "sm_90", "--cache-dir", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "no CUDA GPU is visible" in err and "--allow-no-gpu" in err and "--cross-compile" in err


@no_gpu_only
def test_allow_no_gpu_is_a_noop(tmp_path, capsys):
    manifest = tmp_path / "m.json"
    rc = warmup.main(
        ["--arch", "sm_90", "--cache-dir", str(tmp_path / "c"), "--manifest", str(manifest), "--allow-no-gpu"]
    )
    assert rc == 0
    assert "nothing was compiled" in capsys.readouterr().out
    assert not manifest.exists()


def test_limits_fail_before_compiling(tmp_path, capsys):
    # The size check comes before any compilation (cross-compile: no GPU needed to get there).
    rc = warmup.main(["--arch", "sm_90", "--cross-compile", "--cache-dir", str(tmp_path / "c"), "--budgets", "1024"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "budget" in err


@pytest.mark.slow
@pytest.mark.skipif(not tb.triton_available(), reason="needs triton")
def test_cross_compile_for_sm90_without_gpu(tmp_path):
    cache = tmp_path / "cache"
    manifest = tmp_path / "manifest.json"
    env = dict(os.environ, TRITON_INTERPRET="0", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_overlay.kernels.warmup",
            "--arch",
            "sm_90",
            "--cross-compile",
            "--cache-dir",
            str(cache),
            "--budgets",
            "16",
            "--depth-limits",
            "15",
            "--top-k",
            "8,32",
            "--manifest",
            str(manifest),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(manifest.read_text())
    assert doc["mode"] == "cross-compile" and doc["arch"] == "sm_90" and doc["device"] is None
    # K=8 -> one key word, K=32 -> two; with and without root tokens: four variants.
    got = sorted((v["constexprs"]["W"], v["constexprs"]["HAS_ROOT"]) for v in doc["variants"])
    assert got == [(1, False), (1, True), (2, False), (2, True)]
    for v in doc["variants"]:
        assert "_ddtree_build_kernel.cubin" in v["files"], v["files"]
        assert (cache / v["cache_subdir"] / "_ddtree_build_kernel.cubin").stat().st_size > 0
        assert v["verified"] is None and v["constexprs"]["BUDGET"] == 16
