"""nvidia-smi parsing, fed real H200 captures, derived Blackwell/Ampere output and malformed output."""

import pytest
from conftest import FIXTURES

from ansible_collections.ddtree.sglang.plugins.module_utils import nvidia_smi
from ansible_collections.ddtree.sglang.plugins.module_utils.nvidia_smi import NvidiaSmiParseError


def read(model, name):
    return (FIXTURES / model / name).read_text()


def facts(model, gpu, apps, unit_of_pid=None):
    return nvidia_smi.gpu_facts(read(model, gpu), read(model, apps), read(model, "nvidia_smi_version.txt"), unit_of_pid)


def test_h200_idle_capture():
    result = facts("h200", "query_gpu.csv", "query_apps.csv")
    assert result["driver_version"] == "580.159.04"
    assert result["cuda_version"] == "13.0"
    assert result["gpu_count"] == 1
    gpu = result["gpus"][0]
    assert gpu == {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-00000000-1111-2222-3333-444444444444",
        "pci_bus_id": "00000000:00:06.0",
        "driver_version": "580.159.04",
        "compute_capability": "9.0",
        "sm": 90,
        "memory_total_mib": 143771,
        "memory_used_mib": 0,
        "memory_free_mib": 143156,
        "persistence_mode": True,
        "temperature_c": 38,
        "power_draw_w": 125.43,
        "utilization_pct": 0.0,
        "processes": [],
    }
    assert result["processes"] == []


def test_h200_busy_capture_links_process_to_gpu_and_unit():
    result = facts("h200", "query_gpu_busy.csv", "query_apps_busy.csv", unit_of_pid={498: "sglang-coder.service"}.get)
    assert result["gpus"][0]["memory_used_mib"] == 8157
    assert result["processes"] == [
        {
            "pid": 498,
            "name": "python3",
            "used_memory_mib": 8148,
            "gpu_uuid": "GPU-00000000-1111-2222-3333-444444444444",
            "gpu_index": 0,
            "unit": "sglang-coder.service",
        }
    ]
    assert result["gpus"][0]["processes"] == result["processes"]
    assert result["summary"][-1] == "process 498 (python3) holds 8148 MiB on GPU 0, unit sglang-coder.service"


def test_derived_blackwell_eight_gpus():
    result = facts("rtx-pro-6000-blackwell", "query_gpu_busy.csv", "query_apps_busy.csv")
    assert result["gpu_count"] == 8
    assert {gpu["compute_capability"] for gpu in result["gpus"]} == {"12.0"}
    assert {gpu["sm"] for gpu in result["gpus"]} == {120}
    assert {gpu["memory_total_mib"] for gpu in result["gpus"]} == {97887}
    assert [gpu["index"] for gpu in result["gpus"]] == list(range(8))
    assert sorted(proc["gpu_index"] for proc in result["processes"]) == [0, 1]
    assert [len(gpu["processes"]) for gpu in result["gpus"]] == [1, 1, 0, 0, 0, 0, 0, 0]


def test_derived_ampere_two_gpus():
    result = facts("rtx-a6000", "query_gpu_busy.csv", "query_apps_busy.csv")
    assert [(gpu["name"], gpu["sm"], gpu["memory_total_mib"]) for gpu in result["gpus"]] == [
        ("NVIDIA RTX A6000", 86, 49140),
        ("NVIDIA RTX A6000", 86, 49140),
    ]
    assert [proc["gpu_index"] for proc in result["processes"]] == [1]
    assert result["summary"][0] == "driver 580.159.04, CUDA 13.0, 2 GPU(s)"


def test_not_available_values_become_none():
    header = read("h200", "query_gpu.csv").splitlines()[0]
    row = (
        "0, NVIDIA H200, GPU-x, 00000000:00:06.0, 580.159.04, 9.0, 143771 MiB, [N/A], [N/A], [N/A], [N/A], [N/A], [N/A]"
    )
    gpu = nvidia_smi.parse_gpus(header + "\n" + row + "\n")[0]
    assert gpu["memory_used_mib"] is None
    assert gpu["persistence_mode"] is None
    assert gpu["temperature_c"] is None
    assert gpu["power_draw_w"] is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "printed nothing"),
        ("index, name\n0, NVIDIA H200\n", "header has 2 columns, expected 13"),
        (None, "line 2 has 12 values"),
        ("BAD_MIB", "'lots' is not a size in MiB"),
        ("BAD_CAP", "'nine' is not a compute capability"),
        ("BAD_PERSISTENCE", "'Maybe' is neither Enabled nor Disabled"),
    ],
)
def test_malformed_gpu_output(text, message):
    good = read("h200", "query_gpu.csv")
    header, row = good.splitlines()[:2]
    if text is None:
        text = header + "\n" + row.rsplit(",", 1)[0] + "\n"
    elif text == "BAD_MIB":
        text = header + "\n" + row.replace("143771 MiB", "lots") + "\n"
    elif text == "BAD_CAP":
        text = header + "\n" + row.replace(", 9.0,", ", nine,") + "\n"
    elif text == "BAD_PERSISTENCE":
        text = header + "\n" + row.replace("Enabled", "Maybe") + "\n"
    with pytest.raises(NvidiaSmiParseError, match=message):
        nvidia_smi.parse_gpus(text)


def test_process_on_unknown_gpu_is_an_error():
    apps = "pid, process_name, used_gpu_memory [MiB], gpu_uuid\n7, python3, 10 MiB, GPU-not-listed\n"
    with pytest.raises(NvidiaSmiParseError, match="pid 7 uses GPU GPU-not-listed"):
        nvidia_smi.gpu_facts(read("h200", "query_gpu.csv"), apps, read("h200", "nvidia_smi_version.txt"))


def test_version_without_cuda_line_is_an_error():
    with pytest.raises(NvidiaSmiParseError, match="CUDA Version"):
        nvidia_smi.parse_version("NVIDIA-SMI version  : 580.159.04\nDRIVER version      : 580.159.04\n")


def test_version_capture():
    assert nvidia_smi.parse_version(read("h200", "nvidia_smi_version.txt")) == {
        "driver_version": "580.159.04",
        "cuda_version": "13.0",
        "nvml_version": "580.159",
    }


@pytest.mark.parametrize(
    "cgroup, unit",
    [
        ("0::/system.slice/sglang-coder.service\n", "sglang-coder.service"),
        (
            "12:pids:/system.slice/foreign-gpu.service\n1:name=systemd:/system.slice/foreign-gpu.service\n",
            "foreign-gpu.service",
        ),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
        ("", None),
    ],
)
def test_systemd_unit_from_cgroup(cgroup, unit):
    assert nvidia_smi.systemd_unit_from_cgroup(cgroup) == unit


@pytest.mark.parametrize(
    "found, required, expected",
    [
        ("580.159.04", "580.65.06", True),
        ("570.86.10", "580.65.06", False),
        ("580.65.06", "580.65.06", True),
        ("1000.1", "580.65.06", True),
    ],
)
def test_version_at_least(found, required, expected):
    assert nvidia_smi.version_at_least(found, required) is expected


def test_version_tuple_rejects_garbage():
    with pytest.raises(ValueError, match="'580.x' is not a dotted version"):
        nvidia_smi.version_tuple("580.x")
