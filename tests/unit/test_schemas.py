"""Every option is declared once, in module_utils; each other place says the same or is made from it.

- A service's fields (services.SERVICE_FIELDS): service_plan's argument spec is made from them, and its
  DOCUMENTATION is checked here; the sglang_service role's argument spec leaves them to service_plan
  (`sglang_services` is a list of mappings), whose refusals name the service and the closest field.
- The health gate's options (gate_options.GATE_OPTIONS): sglang_health's argument spec is made from them;
  its DOCUMENTATION is checked here, and the table in docs/health-gate.md is generated from them
  (`python plugins/module_utils/gate_options.py` prints it); the per-service gate settings (`health`) are the
  options marked per_service, with the gate's types, in service_plan's argument spec and the role's
  sglang_service_gate_defaults; the role's defaults for them are the gate's defaults.
"""

import pytest
import yaml
from conftest import REPO_ROOT

from ansible_collections.ddtree.sglang.plugins.module_utils.gate_options import (
    GATE_OPTIONS,
    GATE_SETTINGS,
    options_table,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.services import SERVICE_FIELDS
from ansible_collections.ddtree.sglang.plugins.modules import service_plan, sglang_health

ROLE_SPEC = REPO_ROOT / "roles" / "sglang_service" / "meta" / "argument_specs.yml"
GATE_DOC = REPO_ROOT / "docs" / "health-gate.md"
# What an option is, in every copy (descriptions differ on purpose: each says it for its reader).
KEYS = ("type", "elements", "required", "default", "choices")


def shape(options):
    """{name: {key: value}} of KEYS, recursively for suboptions; defaults ansible-core would assume filled in."""
    result = {}
    for name, spec in (options or {}).items():
        entry = {key: spec[key] for key in KEYS if spec.get(key) not in (None, False)}
        entry.setdefault("type", "str")
        nested = spec.get("options") or spec.get("suboptions")
        if nested:
            entry["options"] = shape(nested)
        result[name] = entry
    return result


def role_services():
    spec = yaml.safe_load(ROLE_SPEC.read_text())
    return spec["argument_specs"]["main"]["options"]["sglang_services"]


def documented(module):
    return yaml.safe_load(module.DOCUMENTATION)["options"]


def differences(label_a, a, label_b, b, path=""):
    """Readable differences between two shapes."""
    found = []
    for name in sorted(set(a) | set(b)):
        where = path + name
        if name not in a or name not in b:
            found.append("%s: only in %s" % (where, label_a if name in a else label_b))
            continue
        left, right = dict(a[name]), dict(b[name])
        for key in sorted((set(left) | set(right)) - {"options"}):
            if left.get(key) != right.get(key):
                found.append(
                    "%s.%s: %s says %r, %s says %r" % (where, key, label_a, left.get(key), label_b, right.get(key))
                )
        found += differences(label_a, left.get("options", {}), label_b, right.get("options", {}), where + ".")
    return found


# ---- a service's fields ----------------------------------------------------------------------------


def test_service_fields_are_the_same_in_service_plans_argument_spec_and_its_documentation():
    assert (
        differences(
            "service_plan's argument spec",
            shape(service_plan.SERVICE_OPTIONS),
            "service_plan's DOCUMENTATION",
            shape(documented(service_plan)["services"]["suboptions"]),
        )
        == []
    )


def test_the_role_leaves_a_services_fields_to_the_plan():
    """The role's argument spec would refuse a misspelt field before the plan runs, in words without the service or
    the closest field: it declares the services a list of mappings, and service_plan checks each field (its
    action plugin, then its argument spec: the one declaration, services.SERVICE_FIELDS)."""
    declared = role_services()
    assert (declared["type"], declared["elements"]) == ("list", "dict")
    assert "options" not in declared
    assert "ddtree.sglang.service_plan" in " ".join(declared["description"])


# ---- the gate's options ----------------------------------------------------------------------------


def test_gate_options_are_the_same_in_the_module_code_and_its_documentation():
    assert (
        differences(
            "ARGUMENT_SPEC", shape(sglang_health.ARGUMENT_SPEC), "DOCUMENTATION", shape(documented(sglang_health))
        )
        == []
    )


def test_docs_health_gate_md_holds_the_table_made_from_the_declarations():
    text = GATE_DOC.read_text()
    table = text[text.index("| option | type | default | meaning |") :].split("\n\n")[0] + "\n"
    assert table == options_table(), (
        "docs/health-gate.md's option table is not the one made from gate_options.GATE_OPTIONS: "
        "replace it with the output of `python plugins/module_utils/gate_options.py`"
    )


def test_every_declared_option_has_a_doc_line_and_a_known_type():
    for declarations in (GATE_OPTIONS, SERVICE_FIELDS):
        for name, declared in declarations.items():
            assert declared["doc"].strip(), name
            assert declared["type"] in ("str", "int", "float", "bool", "list", "dict", "path", "raw"), name


def test_the_role_defaults_of_the_gate_settings_are_the_gates_own():
    defaults = yaml.safe_load((REPO_ROOT / "roles" / "sglang_service" / "defaults" / "main.yml").read_text())
    spec = yaml.safe_load(ROLE_SPEC.read_text())["argument_specs"]["main"]["options"]
    for name in ("start_timeout", "no_progress_timeout"):
        variable = "sglang_service_" + name
        assert defaults[variable] == spec[variable]["default"] == GATE_OPTIONS[name]["default"], variable


# ---- per-service gate settings ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "where, settings",
    [
        ("service_plan's argument spec", lambda: service_plan.SERVICE_OPTIONS["health"]["options"]),
        (
            "service_plan's DOCUMENTATION",
            lambda: documented(service_plan)["services"]["suboptions"]["health"]["suboptions"],
        ),
        (
            "the role's sglang_service_gate_defaults",
            lambda: yaml.safe_load(ROLE_SPEC.read_text())["argument_specs"]["main"]["options"][
                "sglang_service_gate_defaults"
            ]["options"],
        ),
        ("service_plan's gate_defaults", lambda: documented(service_plan)["gate_defaults"]["suboptions"]),
    ],
)
def test_per_service_gate_settings_are_gate_options_of_the_gates_type(where, settings):
    settings = shape(settings())
    assert sorted(settings) == sorted(GATE_SETTINGS), "%s lists other settings than gate_options.GATE_SETTINGS" % where
    gate = shape(sglang_health.ARGUMENT_SPEC)
    assert {name: settings[name]["type"] for name in settings} == {name: gate[name]["type"] for name in settings}
