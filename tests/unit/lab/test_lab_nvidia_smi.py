"""The lab's nvidia-smi prints what a real one prints: checked byte for byte against the H200 capture."""

import json
import os
import subprocess

import pytest
from conftest import FIXTURES, REPO_ROOT

from ansible_collections.ddtree.sglang.plugins.module_utils import nvidia_smi

LAB_NVIDIA_SMI = REPO_ROOT / "lab" / "nvidia-smi" / "nvidia-smi"
MODELS = json.loads((REPO_ROOT / "lab" / "nvidia-smi" / "gpu-models.json").read_text())
H200 = FIXTURES / "h200"
CAPTURE_QUERY = [
    "--query-gpu=index,name,uuid,pci.bus_id,driver_version,compute_cap,memory.total,memory.used,"
    "memory.free,persistence_mode,temperature.gpu,power.draw,utilization.gpu",
    "--format=csv",
]


@pytest.fixture
def lab(tmp_path):
    """run(*args, holders={pid: "0,1"}, model="h200", count=1, fault=None) -> CompletedProcess."""

    def run(*args, holders=None, model="h200", count=1, fault=None):
        proc = tmp_path / "proc"
        for pid, gpus in (holders or {}).items():
            (proc / str(pid)).mkdir(parents=True, exist_ok=True)
            (proc / str(pid) / "environ").write_bytes(b"PATH=/bin\0LAB_NVIDIA_GPUS=" + gpus.encode() + b"\0")
            (proc / str(pid) / "comm").write_text("python3\n")
        proc.mkdir(exist_ok=True)
        config = tmp_path / "nvidia-smi.json"
        config.write_text(
            json.dumps(
                {
                    "model": MODELS[model],
                    "count": count,
                    "driver_version": "580.159.04",
                    "cuda_version": "13.0",
                    "fault": fault,
                    "uuids": {"0": "GPU-00000000-1111-2222-3333-444444444444"},
                }
            )
        )
        env = dict(os.environ, LAB_NVIDIA_SMI_CONFIG=str(config), LAB_NVIDIA_SMI_PROC=str(proc))
        return subprocess.run([str(LAB_NVIDIA_SMI), *args], env=env, capture_output=True, text=True, check=False)

    return run


def test_idle_query_equals_capture(lab):
    assert lab(*CAPTURE_QUERY).stdout == (H200 / "query_gpu.csv").read_text()
    assert lab(*nvidia_smi.apps_query_args()).stdout == (H200 / "query_apps.csv").read_text()
    assert lab("--version").stdout == (H200 / "nvidia_smi_version.txt").read_text()


def test_busy_queries_equal_capture_except_sensors(lab):
    assert lab(*nvidia_smi.apps_query_args(), holders={498: "0"}).stdout == (H200 / "query_apps_busy.csv").read_text()
    ours = nvidia_smi.parse_gpus(lab(*CAPTURE_QUERY, holders={498: "0"}).stdout)[0]
    real = nvidia_smi.parse_gpus((H200 / "query_gpu_busy.csv").read_text())[0]
    sensors = ("temperature_c", "power_draw_w", "memory_free_mib")
    assert {k: v for k, v in ours.items() if k not in sensors} == {k: v for k, v in real.items() if k not in sensors}
    assert abs(ours["memory_free_mib"] - real["memory_free_mib"]) <= 1


def test_plain_screen_equals_capture_except_date_and_power(lab):
    ours = lab(holders={498: "0"}).stdout.splitlines()
    real = (H200 / "nvidia_smi_busy.txt").read_text().splitlines()[1:]  # first line is the date
    assert len(ours) == len(real)
    differing = [(a, b) for a, b in zip(ours, real) if a != b]
    assert len(differing) == 1 and "125W /  700W" in differing[0][0] and "121W /  700W" in differing[0][1]


def test_holders_on_eight_gpus(lab):
    facts = nvidia_smi.gpu_facts(
        lab(*nvidia_smi.gpu_query_args(), holders={10: "1,3", 11: "9"}, model="rtx-pro-6000-blackwell", count=8).stdout,
        lab(
            *nvidia_smi.apps_query_args(), holders={10: "1,3", 11: "9"}, model="rtx-pro-6000-blackwell", count=8
        ).stdout,
        lab("--version").stdout,
    )
    assert facts["gpu_count"] == 8
    assert [(p["pid"], p["gpu_index"]) for p in facts["processes"]] == [(10, 1), (10, 3)]  # GPU 9 doesn't exist
    assert facts["gpus"][1]["memory_used_mib"] == 8157


def test_faults(lab):
    driver = lab("--version", fault="driver")
    assert driver.returncode == 9 and "couldn't communicate with the NVIDIA driver" in driver.stdout
    garbage = lab(*nvidia_smi.gpu_query_args(), fault="garbage")
    with pytest.raises(nvidia_smi.NvidiaSmiParseError):
        nvidia_smi.parse_gpus(garbage.stdout)


def test_unknown_field_and_arguments_fail_like_nvidia_smi(lab):
    bad_field = lab("--query-gpu=index,bogus", "--format=csv")
    assert bad_field.returncode == 2 and 'Field "bogus" is not a valid field to query.' in bad_field.stdout
    assert lab("--frobnicate").returncode == 2
