"""The sglang_service role gates a service the same way after a deploy and after a rollback.

The role's task files are read as data and their ddtree.sglang.sglang_health calls rendered with
ansible-core's own templating, following include_tasks, for a service whose plan came from
service_plan: what the role really passes, without a host.
"""

from pathlib import Path

import pytest
import yaml

from ansible_collections.ddtree.sglang.plugins.modules import service_plan

from conftest import run_module

TASKS = Path(__file__).resolve().parents[3] / "roles" / "sglang_service" / "tasks"
DEFAULTS = TASKS.parent / "defaults" / "main.yml"
OMIT = "__omit_place_holder__test"
GATE = "ddtree.sglang.sglang_health"
INCLUDE = "ansible.builtin.include_tasks"

# A slow-starting model: its own start_timeout is twice the role's default.
SLOW = {"name": "coder", "model_path": "/m", "draft_model_path": "/d", "gpus": [0, 1], "tp_size": 2, "port": 30000,
        "speculative": {"algorithm": "DDTREE"}, "health": {"start_timeout": 1800, "min_accept_length": 2.5}}


def render(value, variables):
    # Imported here, not when pytest collects this file: imported that early, it took `warnings` out of
    # the module results that tests/unit/plugins/modules read.
    from ansible.template import Templar, trust_as_template

    templar = Templar(variables=variables)
    if isinstance(value, str):
        return templar.template(trust_as_template(value))
    return templar.template(value)


def gate_calls(task_file, variables):
    """The sglang_health calls a task file makes, following include_tasks: [(task name, arguments)]."""
    calls = []
    for task in yaml.safe_load((TASKS / task_file).read_text()):
        if GATE in task:
            arguments = {key: render(value, variables) for key, value in task[GATE].items()}
            calls.append((task["name"], {key: value for key, value in arguments.items() if value != OMIT}))
        elif INCLUDE in task:
            # As Ansible does: the include's vars may use the loop's variable, and the loop the include's vars.
            loop_var = (task.get("loop_control") or {}).get("loop_var", "item")
            elements = [None]
            if "loop" in task:
                from ansible.errors import AnsibleUndefinedVariable  # imported late, as render() says why

                outer = dict(variables)
                for key, value in (task.get("vars") or {}).items():
                    try:
                        outer[key] = render(value, outer)
                    except AnsibleUndefinedVariable:  # one that needs the loop's variable
                        outer.pop(key, None)
                elements = render(task["loop"], outer)
            included = task[INCLUDE]["file"] if isinstance(task[INCLUDE], dict) else task[INCLUDE]
            for element in elements:
                inner = dict(variables, **{loop_var: element}) if "loop" in task else dict(variables)
                for key, value in (task.get("vars") or {}).items():
                    inner[key] = render(value, inner)
                calls += gate_calls(included, inner)
    return calls


@pytest.fixture
def role_variables(capsys):
    """A failed deploy of SLOW, as gate.yml and rollback.yml see it."""
    defaults = yaml.safe_load(DEFAULTS.read_text())
    code, result = run_module(service_plan, {
        "services": [SLOW], "gpu_indices": list(range(8)), "host": "ct200",
        "gate_defaults": {"start_timeout": defaults["sglang_service_start_timeout"],
                          "no_progress_timeout": defaults["sglang_service_no_progress_timeout"]}}, capsys)
    assert code == 0
    entry = result["services"][0]
    return dict(
        defaults, omit=OMIT, sglang_services=[SLOW],
        sglang_service_plan={"services": [entry]},
        sglang_service_restarted={"results": [{"changed": True, "item": entry["unit"]}]},
        sglang_service_started={"results": []},
        sglang_service_since={"stdout": "2026-11-30 10:00:00"},
        sglang_service_release={"release_id": "candidate"},
        # The gate names each service's own release (its pin, the candidate, or the base release).
        sglang_service_releases={"services": {entry["name"]: {"release_id": "new", "follows": "candidate"}}},
        sglang_service_rollback_since={"stdout": "2026-11-30 10:05:00"},
        sglang_service_rolled_back={"release_id": "old", "before": {"release_id": "new"}},
        sglang_service_failed={"item": entry, "passed": False, "msg": "failed"},
        sglang_service_gate_results=[],
        sglang_service_units_verdict_gate=[],
        sglang_service_units_verdict_rollback=[],
    )


def test_one_task_file_holds_the_gate_call():
    files = sorted(path.name for path in TASKS.glob("*.yml") if GATE in path.read_text())
    assert files == ["health_gate.yml"]


def test_deploy_and_rollback_gates_use_the_services_own_settings(role_variables):
    deploy = gate_calls("gate.yml", role_variables)
    rollback = gate_calls("rollback.yml", role_variables)
    assert len(deploy) == 1 and len(rollback) == 1
    deploy_args, rollback_args = deploy[0][1], rollback[0][1]
    # The service's own start_timeout holds on the way back: the previous release of a slow model
    # needs as long to start as the new one did.
    assert float(rollback_args["start_timeout"]) == 1800 == float(deploy_args["start_timeout"])
    assert float(rollback_args["no_progress_timeout"]) == 120 == float(deploy_args["no_progress_timeout"])
    assert float(rollback_args["min_accept_length"]) == 2.5 == float(deploy_args["min_accept_length"])
    assert deploy_args["release_id"] == "new" and rollback_args["release_id"] == "old"
    # Only the deploy's numbers are compared with and recorded as the release's metrics.
    assert deploy_args["record_metrics"] is True and deploy_args["metrics_file"] == "/var/lib/sglang/coder/metrics.json"
    assert rollback_args["record_metrics"] is False and "metrics_file" not in rollback_args
    # Both record their verdict, so a run that dies after the gate still leaves it behind.
    assert deploy_args["verdict_file"] == rollback_args["verdict_file"] == "/var/lib/sglang/coder/verdicts.json"
    same = {key for key in deploy_args if key not in ("since", "release_id", "record_metrics", "metrics_file")}
    assert {key: deploy_args[key] for key in same} == {key: rollback_args.get(key) for key in same}


VARS = TASKS.parent / "vars" / "main.yml"


def verdict_units(gate_status, switched=()):
    """vars/main.yml's verdict lists, rendered for a service_gate_status result and the links switched."""
    variables = {"sglang_service_gate_status": {"services": gate_status},
                 "sglang_service_link_results": {"results": [{"changed": unit in switched, "item": {"unit": unit}}
                                                             for unit in ("sglang-coder.service", "sglang-chat.service")]}}
    for name, expression in yaml.safe_load(VARS.read_text()).items():
        if "verdict" in name:
            variables[name] = render(expression, variables)
    return {key: variables["sglang_service_units_verdict_" + key] for key in ("restart", "gate", "rollback")}


def test_a_release_without_a_passed_verdict_is_gated_or_rolled_back_though_nothing_changed(role_variables):
    status = {"coder": {"action": "restart", "unit": "sglang-coder.service"},
              "chat": {"action": "rollback", "unit": "sglang-chat.service"}}
    assert verdict_units(status) == {"restart": ["sglang-coder.service"], "gate": ["sglang-coder.service"],
                                     "rollback": ["sglang-chat.service"]}
    # A release switched to in this run is a deploy: gated afresh, never rolled back on an old verdict.
    assert verdict_units(status, switched=["sglang-chat.service"])["rollback"] == []
    status = {"coder": {"action": "gate", "unit": "sglang-coder.service"}, "chat": {"action": "none", "unit": "sglang-chat.service"}}
    assert verdict_units(status) == {"restart": [], "gate": ["sglang-coder.service"], "rollback": []}
    # gate.yml: nothing restarted in this run, yet the service without a verdict is gated.
    variables = dict(role_variables, sglang_service_restarted={"results": []}, sglang_service_units_verdict_gate=["sglang-coder.service"])
    assert [name for name, _arguments in gate_calls("gate.yml", variables)] == ["Gate the service on its release: {{ sglang_service_gate_service.name }}"]
    variables["sglang_service_units_verdict_gate"] = []
    assert gate_calls("gate.yml", variables) == []


def test_a_bakes_recheck_is_the_same_gate_call_with_the_quick_stages_only(role_variables, monkeypatch):
    # The loop's filter, called directly: ansible's plugin loader does not see this checkout's collection
    # once pytest has imported it as a plain package.
    from ansible_collections.ddtree.sglang.plugins.filter.rollout import rollout_bake_checks

    plain_render = render

    def render_with_collection_filters(value, variables):
        if isinstance(value, str) and "ddtree.sglang.rollout_bake_checks(hostvars)" in value:
            return rollout_bake_checks(variables["sglang_service_bake_hosts"], variables["hostvars"])
        return plain_render(value, variables)

    monkeypatch.setitem(globals(), "render", render_with_collection_filters)
    entry = role_variables["sglang_service_plan"]["services"][0]
    check = {"host": "ct200", "service": entry, "since": "2026-11-30 10:00:00", "release_id": "new"}
    variables = dict(role_variables, sglang_service_bake_hosts=["ct200"], sglang_service_bake_results=[],
                     hostvars={"ct200": dict(role_variables)}, sglang_service_bake={"failed": [], "inconclusive": []})
    rechecks = gate_calls("bake.yml", variables)
    assert len(rechecks) == 1
    arguments = rechecks[0][1]
    deploy = gate_calls("gate.yml", role_variables)[0][1]
    # The quick stages: no generations for a baseline or the speed, nothing recorded, no floors to meet.
    assert arguments["prompts"] == []
    for key in ("baseline_file", "metrics_file", "verdict_file", "min_tokens_per_second", "min_accept_length"):
        assert key not in arguments, key
    assert arguments["record_metrics"] is False
    # The service's own settings, and the journal since the deploy's restart.
    assert float(arguments["start_timeout"]) == 1800 == float(deploy["start_timeout"])
    assert (arguments["since"], arguments["release_id"], arguments["port"]) == (check["since"], "new", deploy["port"])


def test_a_shadow_is_gated_without_a_baseline_of_its_own_and_its_production_service_measured_on_the_same_request(role_variables, capsys):
    shadow = dict(SLOW, name="coder-shadow", gpus=[2, 3], port=30010, shadow_of="coder")
    arguments = {"services": [SLOW, shadow], "gpu_indices": list(range(8)), "host": "ct200",
                 "gate_defaults": {"start_timeout": 900, "no_progress_timeout": 120}}
    code, result = run_module(service_plan, arguments, capsys)
    assert code == 0
    coder, shadow_entry = result["services"]
    variables = dict(role_variables, sglang_services=[SLOW, shadow], sglang_service_plan={"services": [coder, shadow_entry]},
                     sglang_service_restarted={"results": [{"changed": True, "item": shadow_entry["unit"]}]},
                     sglang_service_releases={"services": {
                         "coder": {"release_id": "old", "follows": "shadow", "shadow": "coder-shadow"},
                         "coder-shadow": {"release_id": "new", "follows": "candidate"}}},
                     sglang_service_gate_result={})
    calls = gate_calls("gate.yml", variables)
    assert [(arguments["name"], arguments["release_id"]) for _name, arguments in calls] == [("coder-shadow", "new"), ("coder", "old")]
    shadow_gate, measure = calls[0][1], calls[1][1]
    # The shadow's reference is its production service, live: a baseline of its own would keep a held candidate's outputs.
    assert "baseline_file" not in shadow_gate and measure["baseline_file"] == "/var/lib/sglang/coder/baseline.json"
    # Acceptance from the same /generate request on both, not from averages over whatever each served.
    assert shadow_gate["accept_length_from"] == measure["accept_length_from"] == "generate"
    assert measure["record_metrics"] is False and "metrics_file" not in measure
    # A service without a shadow keeps the server's average.
    assert gate_calls("gate.yml", role_variables)[0][1]["accept_length_from"] == "server_info"
