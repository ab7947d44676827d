"""The environment variables a unit's Environment= lines carry (rollout_pull_environment): each that a quoted
systemd line would read otherwise is named with its fix, before the role changes anything."""

import pytest

from ansible_collections.ddtree.sglang.plugins.filter.unit_environment_problems import unit_environment_problems

V = "rollout_pull_environment"


def test_names_and_values_a_unit_line_carries_pass():
    fine = {"HTTPS_PROXY": "http://proxy:3128", "RETRIES": 3, "RATIO": 0.5, "_X1": "", "LITERAL": "50%%"}
    assert unit_environment_problems(fine, V) == []


@pytest.mark.parametrize(
    "environment, fragment",
    [
        ({"1ST": "x"}, "'1ST' is not a variable name"),
        ({"MY-VAR": "x"}, "'MY-VAR' is not a variable name"),
        ({"A": True}, "A: True is true or false"),
        ({"A": "x\ny"}, "A: 'x\\ny' holds a line break"),
        ({"A": 'say "hi"'}, "double quote or a backslash"),
        ({"A": "C:\\dir"}, "double quote or a backslash"),
        ({"A": "50%"}, "systemd expands as a specifier; write %% for a literal %"),
        ({"A": "%%%"}, "specifier"),
        ({"A": None}, "A: None is not a string or a number"),
        ({"A": ["x"]}, "not a string or a number"),
    ],
)
def test_each_thing_a_quoted_unit_line_reads_otherwise_is_named(environment, fragment):
    (problem,) = unit_environment_problems(environment, V)
    assert problem.startswith(V) and fragment in problem


def test_every_bad_variable_is_listed_in_name_order():
    problems = unit_environment_problems({"B": True, "A": "x\ny", "C": "ok"}, V)
    assert [p.split(":")[0] for p in problems] == [V + ".A", V + ".B"]


def test_a_mapping_is_required():
    with pytest.raises(TypeError, match="rollout_pull_environment must be a mapping"):
        unit_environment_problems(["A=1"], V)


def test_the_role_checks_them_before_its_first_change():
    from pathlib import Path

    import yaml

    tasks = yaml.safe_load((Path(__file__).resolve().parents[4] / "roles/rollout_pull/tasks/main.yml").read_text())
    names = [t["name"] for t in tasks]
    check = names.index("Check the rollouts' environment variables before changing anything")
    first_change = next(
        i for i, t in enumerate(tasks) if any(k in t for k in ("ansible.builtin.group", "ansible.builtin.user"))
    )
    assert check < first_change
    assert "unit_environment_problems('rollout_pull_environment')" in str(tasks[check])
