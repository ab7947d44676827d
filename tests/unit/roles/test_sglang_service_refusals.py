"""A service declared wrong in the inventory, through the sglang_service role as a rollout runs it: refused by the
plan with the words service_plan gives (the service, the field, the closest one), before anything changes.

ansible-playbook on this machine (a few seconds each): ct200 is this machine over the local connection, with the
facts the role would otherwise read on it (its stack, its GPUs) set beforehand, so the role's first tasks are its
argument spec's check and the plan.
"""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "unit"))
from playbook_run import run_playbook  # noqa: E402
from service_samples import coder  # noqa: E402

LABEL = "ct200: sglang_services[0] (coder)"
PLAN_TASK = "Validate the services against each other and this host's GPUs"


def play_role(tmp_path, services):
    """Run the role on ct200 with these services; return (exit code, output)."""
    playbook = [
        {
            "name": "Services",
            "hosts": "ct200",
            "gather_facts": False,
            "vars": {
                "sglang_services": services,
                "sglang_stack_active": {"id": "lab", "path": str(tmp_path / "stack")},
            },
            "pre_tasks": [
                {
                    "name": "The GPUs gpu_facts would find",
                    "ansible.builtin.set_fact": {
                        "cacheable": True,
                        "ddtree_gpu": {"gpus": [{"index": index, "sm": "120"} for index in range(8)]},
                    },
                }
            ],
            "roles": [{"role": "ddtree.sglang.sglang_service"}],
        }
    ]
    return run_playbook(tmp_path, playbook, hosts="ct200", extra_env={"ANSIBLE_CALLBACK_RESULT_FORMAT": "json"})


def refusal(output):
    """(the name of the task that failed, its result) from ansible-playbook's output."""
    lines = output.splitlines()
    [position] = [index for index, line in enumerate(lines) if line.startswith("fatal: [ct200]: FAILED! => ")]
    task = next(line for line in reversed(lines[:position]) if line.startswith("TASK ["))
    return task, json.loads(lines[position].split(" => ", 1)[1])


@pytest.mark.parametrize(
    "service, start, end",
    [
        (
            coder(speculative={"algorithm": "DDTREE", "budjet": 15}),
            LABEL + ": speculative has unknown field(s) 'budjet'; its fields are algorithm, budget, top_k, ",
            "; did you mean budget?",
        ),
        (
            dict(coder(), modle_path="/models/coder"),
            LABEL + " has unknown field(s) 'modle_path'",
            "did you mean model_path?",
        ),
        (
            coder(health={"start_timout": 1800}),
            LABEL + ": health has unknown field(s) 'start_timout'",
            "did you mean start_timeout?",
        ),
        (coder(port=70000), LABEL + ": port is 70000; it must be from 1 to 65535", ""),
        (coder(environment={"MY-VAR": "1"}), LABEL + ": environment has the key 'MY-VAR'", "not starting with a digit"),
    ],
    ids=["nested typo", "top-level typo", "gate setting typo", "out of range", "environment name"],
)
def test_a_service_declared_wrong_through_the_role_is_refused_by_the_plan_naming_it(tmp_path, service, start, end):
    code, output = play_role(tmp_path, [service])
    assert code == 2, output[-3000:]
    task, result = refusal(output)
    # The role's argument spec lets the services through to the plan, which refuses them before any change.
    assert PLAN_TASK in task, task
    assert result["msg"].startswith("1 problem(s) in sglang_services, nothing was changed: "), result["msg"]
    [said] = result["problems"]
    assert said.startswith(start) and said.endswith(end), said
    assert "changed=0" in output.split("PLAY RECAP", 1)[1]


def test_a_service_without_a_required_field_is_refused_naming_the_service_and_the_field(tmp_path):
    service = coder()
    del service["port"]
    code, output = play_role(tmp_path, [service])
    assert code == 2, output[-3000:]
    task, result = refusal(output)
    assert PLAN_TASK in task, task
    assert result["problems"] == [LABEL + ": port is not set; it is required (Port to listen on)"]
