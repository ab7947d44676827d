"""The preflight role's check that DDTREE services run only on GPUs the overlay's kernels are compiled for: the
role's own task from roles/preflight/tasks/checks.yml, run by ansible-playbook with this checkout's collection
(pytest's process cannot load its filters: tests/unit/roles/test_sglang_service_gate.py says why)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CHECKS = REPO / "roles" / "preflight" / "tasks" / "checks.yml"
TASK = "Check that the overlay's kernels are compiled for the GPUs of the DDTREE services"
CODER = {
    "name": "coder",
    "model_path": "/models/coder",
    "draft_model_path": "/models/coder-dflash",
    "gpus": [0, 1],
    "port": 30000,
    "speculative": {"algorithm": "DDTREE", "budget": 15, "top_k": 8},
}
CHAT = {"name": "chat", "model_path": "/models/chat", "gpus": [2], "port": 30001, "speculative": {"algorithm": "NEXTN"}}


def gpus(name, capability, count=4):
    return [{"index": index, "name": name, "compute_capability": capability} for index in range(count)]


def run_check(tmp_path, services, host_gpus):
    """The task's result on a host named ct300 with these services and GPUs (facts as gpu_facts sets them)."""
    task = next(task for task in yaml.safe_load(CHECKS.read_text()) if task["name"] == TASK)
    out = tmp_path / "result.json"
    playbook = tmp_path / "check.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "ct300",
                    "connection": "local",
                    "gather_facts": False,
                    "vars": {"sglang_services": services},
                    "tasks": [
                        {
                            "name": "GPU facts",
                            "ansible.builtin.set_fact": {"cacheable": True, "ddtree_gpu": {"gpus": host_gpus}},
                        },
                        dict(task, register="check", ignore_errors=True),
                        {
                            "name": "Write",
                            "ansible.builtin.copy": {
                                "content": "{{ check | to_json }}",
                                "dest": str(out),
                                "mode": "0644",
                            },
                        },
                    ],
                }
            ]
        )
    )
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_HOME=str(tmp_path))
    subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            "ct300,",
            "-e",
            "ansible_python_interpreter=" + sys.executable,
            str(playbook),
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    "name, capability", [("NVIDIA RTX PRO 6000 Blackwell Server Edition", "12.0"), ("NVIDIA H200", "9.0")]
)
def test_ddtree_on_gpus_with_kernels_passes(tmp_path, name, capability):
    assert not run_check(tmp_path, [CODER, CHAT], gpus(name, capability)).get("failed")


def test_ddtree_on_a_gpu_without_kernels_fails_naming_host_service_gpu_and_fix(tmp_path):
    result = run_check(tmp_path, [CODER, CHAT], gpus("NVIDIA L40S", "8.9"))
    assert result["failed"]
    assert result["msg"].startswith(
        "ct300: service coder runs DDTREE on GPU 0 (NVIDIA L40S, compute capability 8.9), but the overlay's kernels are "
        "compiled and checked only for compute capabilities 8.6, 9.0, 12.0; run the service with DFLASH on this host, or add "
        "8.9 to KERNEL_GPUS in plugins/module_utils/kernel_targets.py (with that GPU's limits) and pass scripts/test kernels | "
        "ct300: service coder runs DDTREE on GPU 1 (NVIDIA L40S"
    )
    assert "service chat" not in result["msg"]


def test_a_host_without_ddtree_services_passes_on_any_gpu(tmp_path):
    assert not run_check(tmp_path, [CHAT], gpus("NVIDIA L40S", "8.9")).get("failed")
