"""Every field a service declares, walked from the one declaration (services.SERVICE_FIELDS): misspelt, it is
refused naming the service and the field it is closest to; of the wrong type, outside its choices or out of its
range, it is refused naming the field. The same through service_plan's module (ansible-core's check) and through
its action plugin (ansible localhost -m ddtree.sglang.service_plan, the message a user reads)."""

import copy
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, run_module
from service_samples import coder

from ansible_collections.ddtree.sglang.plugins.module_utils import services
from ansible_collections.ddtree.sglang.plugins.module_utils.schema import closest, declaration_problems
from ansible_collections.ddtree.sglang.plugins.modules import service_plan

EIGHT = list(range(8))
LABEL = "ct200: sglang_services[0] (coder)"
# A value of the wrong type for each declared type (ansible-core converts what it can: "8" is an int, 8 a list).
WRONG = {
    "str": {"a": 1},
    "path": ["x"],
    "int": "eight",
    "float": "fast",
    "bool": "maybe",
    "list": {"a": 1},
    "dict": ["a"],
    "raw": "15",  # the one raw field, budget: a number in quotes is refused
}


def fields(options, path=()):
    """(path, declaration) of every field, nested fields included, in declaration order."""
    for name, declared in options.items():
        yield path + (name,), declared
        yield from fields(declared.get("options") or {}, path + (name,))


FIELDS = list(fields(services.SERVICE_FIELDS))
IDS = [".".join(path) for path, _declared in FIELDS]


def service_with(path, value):
    """coder with value at path (the mappings on the way created); the rest of coder unchanged."""
    service = coder()
    where = service
    for name in path[:-1]:
        if not isinstance(where.get(name), dict):
            where[name] = {}
        where = where[name]
    where[path[-1]] = value
    return service


def without(path):
    """coder with the field at path removed (its parent mapping kept, or created empty)."""
    service = service_with(path, None)
    where = service
    for name in path[:-1]:
        where = where[name]
    del where[path[-1]]
    return service


def misspellings(name):
    """A letter doubled, a letter dropped, two letters swapped: typos a hand makes."""
    middle = len(name) // 2
    return {
        name + name[-1],
        name[:middle] + name[middle + 1 :],
        name[: middle - 1] + name[middle] + name[middle - 1] + name[middle + 1 :],
    } - {name}


def test_the_walk_reaches_every_mapping_a_service_declares():
    assert {".".join(path) for path, declared in FIELDS if declared["type"] == "dict" and declared.get("options")} == {
        "speculative",
        "speculative.autotune",
        "health",
        "nodes",
        "guard",
    }
    # environment's keys are the variable names a service sets: a mapping of anything, so it declares no fields.
    assert [
        ".".join(path) for path, declared in FIELDS if declared["type"] == "dict" and not declared.get("options")
    ] == ["environment"]


MAPS = [(path, declared) for path, declared in FIELDS if declared.get("values")]


def test_the_walk_reaches_every_map_of_names_a_service_declares():
    # A mapping whose keys are the user's names declares what its keys and values are, and the walk below takes it.
    assert [".".join(path) for path, _declared in MAPS] == ["environment"]


@pytest.mark.parametrize("path, declared", MAPS, ids=[".".join(path) for path, _declared in MAPS])
def test_every_map_refuses_a_name_it_cannot_take_and_a_value_of_the_wrong_type(path, declared):
    where = "%s: %s" % (LABEL, ".".join(path))
    for entry, said in [
        ({"MY-VAR": "1"}, where + " has the key 'MY-VAR'; "),
        ({"1ST": "1"}, where + " has the key '1ST'; "),
        ({"FOO": True}, where + ".FOO: True is true or false"),
        ({"FOO": None}, where + ".FOO is unset"),
        ({"FOO": {"a": 1}}, where + ".FOO is {'a': 1}; it must be a string"),
        ({"FOO": ["a"]}, where + ".FOO is ['a']; it must be a string"),
        ({"FOO": "a\nb"}, where + ".FOO: 'a\\nb' holds a line break"),
    ]:
        problems = services.service_problems([service_with(path, entry)], EIGHT, "ct200")
        assert any(problem.startswith(said) for problem in problems), (entry, problems)
    # Names of letters, digits and _; a string, or a number written as it reads.
    fine = {"OMP_NUM_THREADS": 8, "NCCL_DEBUG": "INFO", "_X1": "1.5"}
    assert services.service_problems([service_with(path, fine)], EIGHT, "ct200") == []


@pytest.mark.parametrize("path, declared", FIELDS, ids=IDS)
def test_every_field_misspelt_is_refused_naming_the_service_and_the_field_it_is_closest_to(path, declared):
    parent = ".".join(path[:-1])
    for typo in misspellings(path[-1]):
        service = without(path)
        where = service
        for name in path[:-1]:
            where = where[name]
        where[typo] = where.get(path[-1], 1)
        problems = services.service_problems([service], EIGHT, "ct200")
        label = services.service_label("ct200", 0, service)
        expected = "%s%s has unknown field(s) %r" % (label, ": " + parent if parent else "", typo)
        assert any(problem.startswith(expected) for problem in problems), (typo, problems)
        siblings = dict(declared_siblings(path))
        if closest(typo, siblings) == path[-1]:
            assert any(problem.endswith("did you mean %s?" % path[-1]) for problem in problems), (typo, problems)
    # The typo a hand makes most, a letter doubled, is always taken for the field it was meant to be.
    assert closest(path[-1] + path[-1][-1], dict(declared_siblings(path))) == path[-1]


def declared_siblings(path):
    options = services.SERVICE_FIELDS
    for name in path[:-1]:
        options = options[name]["options"]
    return options.items()


@pytest.mark.parametrize("path, declared", FIELDS, ids=IDS)
def test_every_field_mistyped_is_refused_naming_the_field(path, declared):
    service = service_with(path, WRONG[declared["type"]])
    problems = services.service_problems([service], EIGHT, "ct200")
    label = services.service_label("ct200", 0, service)
    assert any(problem.startswith("%s: %s" % (label, ".".join(path))) for problem in problems), problems
    if declared.get("elements"):
        element = {"int": "x", "str": {"a": 1}}[declared["elements"]]
        problems = services.service_problems([service_with(path, [element])], EIGHT, "ct200")
        assert any(problem.startswith("%s: %s[0]" % (LABEL, ".".join(path))) for problem in problems), problems


@pytest.mark.parametrize(
    "path, declared",
    [(path, declared) for path, declared in FIELDS if declared.get("choices") or declared.get("allowed")],
    ids=str,
)
def test_every_field_with_choices_refuses_another_value(path, declared):
    problems = services.service_problems([service_with(path, "NOT-A-CHOICE")], EIGHT, "ct200")
    assert (
        "%s: %s 'NOT-A-CHOICE' is not one of %s"
        % (LABEL, ".".join(path), ", ".join(declared.get("choices") or declared["allowed"]))
        in problems
    )


@pytest.mark.parametrize(
    "path, declared", [(path, declared) for path, declared in FIELDS if "maximum" in declared], ids=str
)
def test_every_port_is_refused_out_of_its_range(path, declared):
    assert declared["minimum"] == 1 and declared["maximum"] == 65535
    for port in (0, 70000):
        problems = services.service_problems([service_with(path, port)], EIGHT, "ct200")
        assert "%s: %s is %d; it must be from 1 to 65535" % (LABEL, ".".join(path), port) in problems


def test_the_ports_have_their_range():
    ranged = {".".join(path) for path, declared in FIELDS if "maximum" in declared}
    # autotune.port's range is autotune_problems' (with its own words), nodes.dist_init_port's (1024-65535) service_nodes'.
    assert ranged == {"port"}


@pytest.mark.parametrize("budget", [15, {1: 63, 16: 15}, "1:63,16:15"])
def test_a_budget_is_an_integer_or_a_schedule(budget):
    assert services.service_problems([service_with(("speculative", "budget"), budget)], EIGHT, "ct200") == []


def test_the_fields_refused_come_first_and_the_rules_still_list_the_rest():
    service = coder(port=70000, speculative={"algoritm": "DDTREE"}, gpus=[42], tp_size=1)
    assert services.service_problems([service], EIGHT, "ct200") == [
        LABEL + ": port is 70000; it must be from 1 to 65535",
        LABEL + ": speculative has unknown field(s) 'algoritm'; its fields are algorithm, budget, top_k, "
        "allow_hybrid_unsafe, num_steps, eagle_topk, num_draft_tokens, autotune; did you mean algorithm?",
        LABEL + ": GPU index 42 does not exist on ct200, which has GPUs 0, 1, 2, 3, 4, 5, 6, 7",
    ]


def test_a_field_refused_is_said_once_and_read_as_unset_by_the_rules():
    for speculative in ({"algorithm": "DDTREE", "top_k": "eight"}, {"algorithm": "DDTREE", "autotune": True}):
        problems = services.service_problems([coder(speculative=speculative, tp_size="two")], EIGHT, "ct200")
        assert len(problems) == 2, problems  # the field's refusal and tp_size's: no rule repeats or trips on them


def test_several_unknown_fields_are_each_given_their_closest():
    problems = declaration_problems({"budjet": 1, "topk": 2, "zzz": 3}, services.SPECULATIVE_FIELDS, "x")
    assert problems == [
        "x has unknown field(s) 'budjet', 'topk', 'zzz'; its fields are algorithm, budget, top_k, allow_hybrid_unsafe, "
        "num_steps, eagle_topk, num_draft_tokens, autotune; did you mean budget for 'budjet', top_k for 'topk'?"
    ]


def typo_of(path):
    """coder with the field at path misspelt (its last letter doubled)."""
    service = without(path)
    where = service
    for name in path[:-1]:
        where = where[name]
    where[path[-1] + path[-1][-1]] = 1
    return service


@pytest.mark.parametrize("path, declared", FIELDS, ids=IDS)
def test_the_module_alone_refuses_every_field_misspelt_and_mistyped(path, declared, capsys):
    """Without its action plugin (a module run by hand on a host): ansible-core's check, then the declaration's.
    A mapping given for a string ansible-core prints into one: only the action plugin sees it as written."""
    cases = [typo_of(path)]
    if declared["type"] not in ("str", "path"):
        cases.append(service_with(path, WRONG[declared["type"]]))
    for service in cases:
        code, result = run_module(
            service_plan, {"services": [copy.deepcopy(service)], "gpu_indices": EIGHT, "host": "ct200"}, capsys
        )
        assert code == 1 and result["failed"], (path, result)


def ansible_localhost_service_plan(service_list):
    """`ansible localhost -m ddtree.sglang.service_plan` as a user runs it (its action plugin first):
    (the one-line status, the result)."""
    env = dict(os.environ, ANSIBLE_CALLBACK_RESULT_FORMAT="json", PYTHONWARNINGS="ignore")
    args = json.dumps({"services": service_list, "gpu_indices": EIGHT, "host": "ct200"})
    out = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "ansible"),
            "localhost",
            "-o",
            "-m",
            "ddtree.sglang.service_plan",
        ]
        + ["-a", args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    status, result = next(line for line in out.splitlines() if line.startswith("localhost |")).split(" => ", 1)
    return status, json.loads(result)


def test_ansible_localhost_m_service_plan_refuses_with_the_service_and_the_closest_field():
    """The issue's table, with the real module as a user runs it: the action plugin's message."""
    status, result = ansible_localhost_service_plan([coder(speculative={"algorithm": "DDTREE", "budjet": 15})])
    assert status == "localhost | FAILED!"
    assert result["problems"] == [
        LABEL + ": speculative has unknown field(s) 'budjet'; its fields are algorithm, budget, top_k, "
        "allow_hybrid_unsafe, num_steps, eagle_topk, num_draft_tokens, autotune; did you mean budget?"
    ]
    status, result = ansible_localhost_service_plan([coder()])
    assert status == "localhost | SUCCESS" and result["services"][0]["name"] == "coder"


def test_the_action_plugin_refuses_every_field_misspelt_and_mistyped_before_the_module_runs():
    """One run of the real action plugin, a service per field misspelt and per field mistyped: each refused
    by name, on the controller (a string given a mapping included, which the module would print into one)."""
    service_list = [
        service for path, declared in FIELDS for service in (typo_of(path), service_with(path, WRONG[declared["type"]]))
    ]
    status, result = ansible_localhost_service_plan(service_list)
    assert status == "localhost | FAILED!"
    assert result["msg"].startswith("%d problem(s) in sglang_services, nothing was changed: " % len(result["problems"]))
    refused = {int(problem.split("[", 1)[1].split("]", 1)[0]) for problem in result["problems"]}
    assert refused == set(range(len(service_list)))
