"""The lab image with stacks is keyed by what decides it: the stack playbook's roles and the plugins they
use, not every file under plugins/ (a health-gate change must not cost a 5-minute image rebuild, and a
stack module change must rebuild it)."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("stacked_inputs", REPO / "lab" / "image" / "stacked_inputs.py")
stacked_inputs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stacked_inputs)


def test_the_stack_roles_and_the_plugins_they_name_are_inputs():
    files = set(stacked_inputs.inputs())
    assert "playbooks/stacks.yml" in files
    assert "roles/sglang_stack/tasks/main.yml" in files
    # Named by the roles (FQCN), and what they import, transitively.
    assert {
        "plugins/modules/stack_verify.py",
        "plugins/modules/wheelhouse.py",
        "plugins/modules/gpu_facts.py",
        "plugins/module_utils/stack.py",
        "plugins/module_utils/pinset.py",
        "plugins/module_utils/nvidia_smi.py",
        "plugins/lookup/cache_dir.py",
        "plugins/plugin_utils/cache.py",
    } <= files


def test_plugins_the_stack_does_not_use_are_not_inputs():
    files = set(stacked_inputs.inputs())
    assert (
        not {
            "plugins/modules/sglang_health.py",
            "plugins/module_utils/health_gate.py",
            "plugins/modules/service_plan.py",
            "roles/sglang_service/tasks/main.yml",
        }
        & files
    )


def test_a_plugin_named_in_a_role_becomes_an_input(tmp_path, monkeypatch):
    repo = tmp_path
    (repo / "roles" / "cuda_stack" / "tasks").mkdir(parents=True)
    (repo / "roles" / "cuda_stack" / "tasks" / "main.yml").write_text("- ddtree.sglang.probe:\n")
    (repo / "plugins" / "modules").mkdir(parents=True)
    (repo / "plugins" / "module_utils").mkdir(parents=True)
    (repo / "plugins" / "modules" / "probe.py").write_text(
        "from ansible_collections.ddtree.sglang.plugins.module_utils.rules import x\n"
    )
    (repo / "plugins" / "module_utils" / "rules.py").write_text("x = 1\n")
    (repo / "plugins" / "module_utils" / "unused.py").write_text("y = 1\n")
    monkeypatch.setattr(stacked_inputs, "REPO", repo)
    assert stacked_inputs.inputs() == [
        "plugins/module_utils/rules.py",
        "plugins/modules/probe.py",
        "roles/cuda_stack/tasks/main.yml",
    ]
