"""Every schema written in more than one place says the same in each.

- A service's fields: the sglang_service role's argument spec (`sglang_services`), service_plan's
  argument spec and its DOCUMENTATION.
- The health gate's options: sglang_health's argument spec, its DOCUMENTATION and the table in
  docs/health-gate.md; and the per-service gate settings (`health`): the role's argument spec,
  service_plan's argument spec and DOCUMENTATION, and services.GATE_SETTINGS, each an option of the
  gate with the gate's type.
"""

import re

import pytest
import yaml
from conftest import REPO_ROOT

from ansible_collections.ddtree.sglang.plugins.module_utils.services import GATE_SETTINGS
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


def role_service_fields():
    spec = yaml.safe_load(ROLE_SPEC.read_text())
    return spec["argument_specs"]["main"]["options"]["sglang_services"]["options"]


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
                found.append("%s.%s: %s says %r, %s says %r" % (where, key, label_a, left.get(key), label_b, right.get(key)))
        found += differences(label_a, left.get("options", {}), label_b, right.get("options", {}), where + ".")
    return found


# ---- a service's fields ----------------------------------------------------------------------------

def test_service_fields_are_the_same_in_the_role_and_in_service_plan():
    role = shape(role_service_fields())
    assert differences("the role's argument spec", role, "service_plan's argument spec", shape(service_plan.SERVICE_OPTIONS)) == []
    assert differences("the role's argument spec", role, "service_plan's DOCUMENTATION",
                       shape(documented(service_plan)["services"]["suboptions"])) == []


# ---- the gate's options ----------------------------------------------------------------------------

def test_gate_options_are_the_same_in_the_module_code_and_its_documentation():
    assert differences("ARGUMENT_SPEC", shape(sglang_health.ARGUMENT_SPEC), "DOCUMENTATION", shape(documented(sglang_health))) == []


def docs_table():
    """docs/health-gate.md's option table: {name: (type cell, default cell)}."""
    text = GATE_DOC.read_text()
    table = text[text.index("## Options"):].split("\n## ")[0]
    rows = {}
    for line in table.splitlines():
        match = re.match(r"^\| `(\w+)` \| ([^|]*) \| ([^|]*) \|", line)
        if match:
            rows[match.group(1)] = (match.group(2).strip(), match.group(3).strip())
    return rows


def doc_type(spec):
    if spec.get("choices"):
        return " or ".join("`%s`" % choice for choice in spec["choices"])
    if spec["type"] == "list":
        return "list of %s" % spec.get("elements", "str")
    return spec["type"] + (" (no_log)" if spec.get("no_log") else "")


def doc_default(value):
    if isinstance(value, bool):
        return "`%s`" % str(value).lower()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return "`%s`" % (value,)


def test_gate_options_are_the_same_in_the_module_and_docs_health_gate_md():
    rows = docs_table()
    assert list(rows) == list(sglang_health.ARGUMENT_SPEC), "docs/health-gate.md lists other options, or in another order"
    problems = []
    for name, spec in sglang_health.ARGUMENT_SPEC.items():
        type_cell, default_cell = rows[name]
        if type_cell != doc_type(spec):
            problems.append("%s: the docs say type %r, the module %r" % (name, type_cell, doc_type(spec)))
        default = spec.get("default")
        if spec.get("required"):
            wanted = "required"
        elif default is None or isinstance(default, list) and default:
            continue  # the docs say in words what happens (a long list, or the unit's own value)
        else:
            wanted = doc_default(default)
        if default_cell != wanted:
            problems.append("%s: the docs say default %r, the module %r" % (name, default_cell, wanted))
    assert problems == []


# ---- per-service gate settings ---------------------------------------------------------------------

@pytest.mark.parametrize("where, settings", [
    ("the role's argument spec", lambda: role_service_fields()["health"]["options"]),
    ("service_plan's argument spec", lambda: service_plan.SERVICE_OPTIONS["health"]["options"]),
    ("service_plan's DOCUMENTATION", lambda: documented(service_plan)["services"]["suboptions"]["health"]["suboptions"]),
])
def test_per_service_gate_settings_are_gate_options_of_the_gates_type(where, settings):
    settings = shape(settings())
    assert tuple(settings) == GATE_SETTINGS, "%s lists other settings than services.GATE_SETTINGS" % where
    gate = shape(sglang_health.ARGUMENT_SPEC)
    assert {name: settings[name]["type"] for name in settings} == {name: gate[name]["type"] for name in settings}
