"""The sglang_service role reads as its phases, and its restart-and-gate step takes declared inputs.

- main.yml lists the phases in the order they happen, each one file; the plan (service_plan) runs in two places
  only: the first plan, and the re-plan after a tuning.
- restart_and_gate.yml's inputs are the entry point restart_and_gate's argument spec (meta/argument_specs.yml):
  the step checks them first, and every include passes a declared event and nothing undeclared of the role's.
"""

from pathlib import Path

import yaml

ROLE = Path(__file__).resolve().parents[3] / "roles" / "sglang_service"
TASKS = ROLE / "tasks"
PHASES = ["Plan", "Account", "Release", "Tune", "Re-plan", "Verify", "Units", "Gate and roll back", "Summary"]
STEP = "restart_and_gate.yml"


def tasks(name):
    return yaml.safe_load((TASKS / name).read_text())


def included_file(task):
    for key in ("ansible.builtin.import_tasks", "ansible.builtin.include_tasks"):
        if key in task:
            return task[key]["file"] if isinstance(task[key], dict) else task[key]
    return None


def entry_point(name):
    return yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"][name]


def test_main_lists_the_phases_in_the_order_they_happen_each_one_file():
    main = tasks("main.yml")
    assert [task["name"].split(" - ", 1)[0] for task in main] == PHASES
    files = [included_file(task) for task in main]
    assert all(files) and len(set(files)) == len(files)
    for file in files:
        assert (TASKS / file).is_file(), file


def test_the_plan_runs_once_to_validate_and_once_more_only_after_a_tuning():
    where = sorted(path.name for path in TASKS.glob("*.yml") if "ddtree.sglang.service_plan:" in path.read_text())
    assert where == ["plan.yml", "replan.yml"]
    [replan] = [task for task in tasks("main.yml") if included_file(task) == "replan.yml"]
    assert "ansible.builtin.include_tasks" in replan and replan["when"] == "sglang_service_plan.untuned | length > 0"


def test_the_step_checks_its_inputs_against_its_entry_points_argument_spec_first():
    first = tasks(STEP)[0]
    assert "argument_specs.restart_and_gate.options" in first["ansible.builtin.validate_argument_spec"]["argument_spec"]


def test_every_include_of_the_step_passes_a_declared_event_and_only_declared_inputs():
    options = entry_point("restart_and_gate")["options"]
    events = options["sglang_service_gate_event"]["choices"]
    seen = set()
    for path in sorted(TASKS.glob("*.yml")):
        for task in yaml.safe_load(path.read_text()) or []:
            if included_file(task) != STEP:
                continue
            given = task.get("vars") or {}
            assert given["sglang_service_gate_event"] in events, path.name
            seen.add(given["sglang_service_gate_event"])
            # The role's own variables a caller sets for the step are its declared inputs; sglang_services (the API
            # key's source) and connection variables are the host's, for a bake on another host.
            role_inputs = {name for name in given if name.startswith("sglang_service_")}
            assert role_inputs <= set(options), (path.name, role_inputs - set(options))
    assert seen == set(events)


def test_the_step_reads_no_implicit_input_of_its_callers():
    text = (TASKS / STEP).read_text()
    for gone in ("sglang_service_gate_deploy", "sglang_service_gate_measure", "sglang_service_bake_check is defined"):
        assert gone not in text
