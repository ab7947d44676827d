"""gpu_facts driven through main(): real captures via a fake nvidia-smi, and every failure path."""

from conftest import FIXTURES, run_module

from ansible_collections.ddtree.sglang.plugins.modules import gpu_facts


def test_facts_from_h200_busy_capture(fake_nvidia_smi, capsys):
    binary = fake_nvidia_smi(FIXTURES / "h200", gpu="query_gpu_busy.csv", apps="query_apps_busy.csv")
    code, result = run_module(gpu_facts, {"nvidia_smi": binary}, capsys)
    assert code == 0
    assert result["changed"] is False
    facts = result["ansible_facts"]["ddtree_gpu"]
    assert facts["gpu_count"] == 1
    assert facts["gpus"][0]["memory_used_mib"] == 8157
    assert facts["processes"][0]["pid"] == 498


def test_check_mode_gathers_the_same(fake_nvidia_smi, capsys):
    binary = fake_nvidia_smi(FIXTURES / "rtx-a6000", gpu="query_gpu_busy.csv", apps="query_apps_busy.csv")
    code, result = run_module(gpu_facts, {"nvidia_smi": binary, "_ansible_check_mode": True}, capsys)
    assert code == 0
    assert result["ansible_facts"]["ddtree_gpu"]["gpu_count"] == 2


def test_missing_nvidia_smi_by_name(capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    code, result = run_module(gpu_facts, {"nvidia_smi": "nvidia-smi-not-installed"}, capsys)
    assert code == 1
    assert "nvidia-smi not found: 'nvidia-smi-not-installed' is not on PATH" in result["msg"]


def test_missing_nvidia_smi_by_path(capsys, tmp_path):
    code, result = run_module(gpu_facts, {"nvidia_smi": str(tmp_path / "nvidia-smi")}, capsys)
    assert code == 1
    assert "is missing or not executable" in result["msg"]


def test_nonzero_exit_shows_the_output(fake_nvidia_smi, capsys):
    message = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    binary = fake_nvidia_smi(stdout=message, rc=9)
    code, result = run_module(gpu_facts, {"nvidia_smi": binary}, capsys)
    assert code == 1
    assert result["rc"] == 9
    assert "exited with 9" in result["msg"] and message in result["msg"]


def test_unparsable_output(fake_nvidia_smi, capsys):
    binary = fake_nvidia_smi(stdout="Segmentation fault in libnvidia-ml: <<<garbage>>>", rc=0)
    code, result = run_module(gpu_facts, {"nvidia_smi": binary}, capsys)
    assert code == 1
    assert result["msg"].startswith("could not parse the output of %s: --query-gpu: header has 1 columns" % binary)
    assert "garbage" in result["outputs"]["gpus"]
