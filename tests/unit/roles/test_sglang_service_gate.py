"""The sglang_service role gates a service the same way after a deploy, a rollback and a promotion.

The role's task files are read as data: each include of restart_and_gate.yml (the one file with the
ddtree.sglang.sglang_health call) is rendered with ansible-core's own templating, and the gate call with
it, for a service whose plan came from service_plan: what the role really passes, without a host.
"""

from pathlib import Path

import yaml
from conftest import run_module

from ansible_collections.ddtree.sglang.plugins.module_utils import service_nodes
from ansible_collections.ddtree.sglang.plugins.module_utils.gate_options import quick_params, with_gate
from ansible_collections.ddtree.sglang.plugins.module_utils.rollout_policy import bake_checks
from ansible_collections.ddtree.sglang.plugins.modules import service_plan, sglang_health

TASKS = Path(__file__).resolve().parents[3] / "roles" / "sglang_service" / "tasks"
DEFAULTS = TASKS.parent / "defaults" / "main.yml"
OMIT = "__omit_place_holder__test"
GATE = "ddtree.sglang.sglang_health"
INCLUDE = "ansible.builtin.include_tasks"
SHARED = "restart_and_gate.yml"

# A slow-starting model: its own start_timeout is twice the role's default.
SLOW = {
    "name": "coder",
    "model_path": "/m",
    "draft_model_path": "/d",
    "gpus": [0, 1],
    "tp_size": 2,
    "port": 30000,
    "speculative": {"algorithm": "DDTREE"},
    "health": {"start_timeout": 1800, "min_accept_length": 2.5},
}


def render(value, variables):
    # Imported here, not when pytest collects this file: imported that early, it took `warnings` out of
    # the module results that tests/unit/plugins/modules read.
    from ansible.template import Templar, trust_as_template

    def trusted(data):  # as Ansible loads a task file: every string in it may be a template
        if isinstance(data, str):
            return trust_as_template(data)
        if isinstance(data, list):
            return [trusted(element) for element in data]
        if isinstance(data, dict):
            return {key: trusted(element) for key, element in data.items()}
        return data

    return Templar(variables=variables).template(trusted(value))


def tasks(task_file):
    return yaml.safe_load((TASKS / task_file).read_text())


def gate_task():
    return next(task for task in tasks(SHARED) if GATE in task)


def gate_calls(task_file, task_name, variables, given=()):
    """The sglang_health arguments of `task_name`'s include of restart_and_gate.yml: [arguments per service gated].

    given: include variables the caller computed (those that use the collection's filters, which do not load in
    pytest's process), taken from `variables` instead of rendered."""
    task = next(task for task in tasks(task_file) if task.get("name") == task_name)
    included = task[INCLUDE]["file"] if isinstance(task[INCLUDE], dict) else task[INCLUDE]
    assert included == SHARED
    from ansible.errors import AnsibleUndefinedVariable  # imported late, as render() says why

    inner = dict(variables)
    pending = {key: value for key, value in (task.get("vars") or {}).items() if key not in given}
    while pending:  # as Ansible does, lazily: a variable may use one declared after it
        for key, value in list(pending.items()):
            try:
                inner[key] = render(value, inner)
                del pending[key]
            except AnsibleUndefinedVariable:
                if len(pending) == 1:
                    raise
    calls = []
    for item in inner["sglang_service_gate"]:
        arguments = {key: render(value, dict(inner, item=item)) for key, value in gate_task()[GATE].items()}
        calls.append({key: value for key, value in arguments.items() if value != OMIT})
    return calls


def module_params(arguments):
    """What sglang_health runs with: its defaults, the arguments, `gate` merged, a quick check's stages dropped."""
    spec = sglang_health.ARGUMENT_SPEC
    params = {name: option.get("default") for name, option in spec.items()}
    params.update({key: value for key, value in arguments.items() if key in spec})
    for key in ("start_timeout", "no_progress_timeout"):
        params[key] = float(params[key])
    params = with_gate(params)
    return quick_params(params) if params["quick"] else params


def plan(services, capsys):
    defaults = yaml.safe_load(DEFAULTS.read_text())
    code, result = run_module(
        service_plan,
        {
            "services": services,
            "gpu_indices": list(range(8)),
            "host": "ct200",
            "gate_defaults": {
                "start_timeout": defaults["sglang_service_start_timeout"],
                "no_progress_timeout": defaults["sglang_service_no_progress_timeout"],
            },
        },
        capsys,
    )
    assert code == 0
    return defaults, result["services"]


def role_variables(capsys, services=(SLOW,)):
    defaults, entries = plan(list(services), capsys)
    entry = entries[0]
    failed = {"item": dict(entry, release_id="new"), "passed": False, "msg": "failed"}
    return dict(
        defaults,
        omit=OMIT,
        sglang_services=list(services),
        sglang_service_plan={"services": entries},
        sglang_service_actions={
            "start": [dict(entry, release_id="new", state="restarted")],
            "gate": [dict(entry, release_id="new")],
        },
        sglang_service_restart_since={"stdout": "2026-11-30 10:00:00"},
        sglang_service_since={"stdout": "2026-11-30 10:00:00"},
        sglang_service_failed=[failed],
        sglang_service_rolled_back={
            "results": [{"release_id": "old", "before": {"release_id": "new"}, "item": failed}]
        },
        sglang_service_promotions={"promote": [dict(entry, release_id="candidate")]},
        # Off here: collection lookups do not load in pytest's process (the tour's lab test gates with the file).
        sglang_service_fleet_baselines_file="",
    )


def test_one_task_file_holds_the_gate_call():
    files = sorted(path.name for path in TASKS.glob("*.yml") if GATE in path.read_text())
    assert files == [SHARED]


def test_deploy_rollback_and_promotion_gates_use_the_services_own_settings(capsys):
    variables = role_variables(capsys)
    [deploy] = gate_calls(
        "switch.yml", "Restart what changed, keep every service running, and gate what was (re)started", variables
    )
    # The rollback's gate entries, as its node_rollback_gates filter computes them from the links' results.
    rollback_gates = service_nodes.rollback_gates(variables["sglang_service_rolled_back"]["results"])
    [rollback] = gate_calls(
        "rollback.yml",
        "Start the previous releases and gate them",
        dict(variables, sglang_service_gate=rollback_gates),
        given=("sglang_service_gate",),
    )
    [promote] = gate_calls(
        "settle.yml", "Restart each promoted production service on the candidate and gate it", variables
    )
    deploy_params, rollback_params = module_params(deploy), module_params(rollback)
    # The service's own start_timeout holds on the way back: the previous release of a slow model needs as
    # long to start as the new one did. The plan's settings go whole.
    assert (
        deploy["gate"]
        == rollback["gate"]
        == promote["gate"]
        == {"start_timeout": 1800, "no_progress_timeout": 120, "min_accept_length": 2.5}
    )
    assert rollback_params["start_timeout"] == 1800 == deploy_params["start_timeout"]
    assert rollback_params["min_accept_length"] == 2.5 == deploy_params["min_accept_length"]
    assert (deploy["release_id"], rollback["release_id"], promote["release_id"]) == ("new", "old", "candidate")
    # Only a deploy's numbers (a promotion is one) are compared with and recorded as the release's metrics.
    assert deploy["record_metrics"] is True and deploy["metrics_file"] == "/var/lib/sglang/coder/metrics.json"
    assert promote["record_metrics"] is True
    assert rollback["record_metrics"] is False and "metrics_file" not in rollback
    # Each records its verdict, so a run that dies after the gate still leaves it behind.
    assert deploy["verdict_file"] == rollback["verdict_file"] == "/var/lib/sglang/coder/verdicts.json"
    same = {key for key in deploy if key not in ("since", "release_id", "record_metrics", "metrics_file")}
    assert {key: deploy[key] for key in same} == {key: rollback.get(key) for key in same}


def test_a_bakes_recheck_is_the_same_gate_call_with_the_quick_stages_only(capsys):
    variables = role_variables(capsys)
    entry = variables["sglang_service_plan"]["services"][0]
    host_state = {"ct200": {"services": [entry], "since": "2026-11-30 09:00:00", "release_id": "new"}}
    [check] = bake_checks(["ct200"], host_state)  # what the rollout_bake_checks filter loops over
    variables = dict(variables, sglang_service_bake_check=check, hostvars={"ct200": {"sglang_services": [SLOW]}})
    [arguments] = gate_calls(
        "bake.yml", "Bake - re-check every service of the hosts updated so far, on its host", variables
    )
    assert arguments["quick"] is True
    params = module_params(arguments)
    # The quick stages: no generations for a baseline or the speed, nothing recorded, no floors to meet.
    assert params["prompts"] == []
    for key in ("baseline_file", "metrics_file", "verdict_file", "min_tokens_per_second", "min_accept_length"):
        assert params[key] is None, key
    assert params["record_metrics"] is False
    # The service's own settings, and the journal since the deploy's restart.
    assert params["start_timeout"] == 1800
    assert (arguments["since"], arguments["release_id"], arguments["port"]) == (check["since"], "new", 30000)


def test_a_shadow_is_gated_without_a_baseline_and_its_production_service_measured_on_the_same_request(capsys):
    shadow = dict(SLOW, name="coder-shadow", gpus=[2, 3], port=30010, shadow_of="coder")
    variables = role_variables(capsys, services=(SLOW, shadow))
    coder, shadow_entry = variables["sglang_service_plan"]["services"]
    variables["sglang_service_actions"]["gate"] = [dict(shadow_entry, release_id="new")]
    [shadow_gate] = gate_calls(
        "switch.yml", "Restart what changed, keep every service running, and gate what was (re)started", variables
    )
    variables["sglang_service_production"] = dict(coder, release_id="old", shadow="coder-shadow")
    [measure] = gate_calls(
        "shadow.yml",
        "Measure the production service with the gate, recording nothing: {{ sglang_service_production.name }}",
        variables,
    )
    assert (shadow_gate["name"], measure["name"], measure["release_id"]) == ("coder-shadow", "coder", "old")
    # The shadow's reference is its production service, live: a baseline of its own would keep a held candidate's
    # outputs.
    assert "baseline_file" not in shadow_gate and measure["baseline_file"] == "/var/lib/sglang/coder/baseline.json"
    # Acceptance from the same /generate request on both, not from averages over whatever each served.
    assert (
        module_params(shadow_gate)["accept_length_from"] == module_params(measure)["accept_length_from"] == "generate"
    )
    assert measure["record_metrics"] is False and "metrics_file" not in measure
    # A service without a shadow keeps the server's average.
    [deploy] = gate_calls(
        "switch.yml",
        "Restart what changed, keep every service running, and gate what was (re)started",
        dict(variables, sglang_service_actions={"start": [], "gate": [dict(coder, release_id="new")]}),
    )
    assert module_params(deploy)["accept_length_from"] == "server_info"
