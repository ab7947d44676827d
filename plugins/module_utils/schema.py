# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Options declared once, and what a declaration refuses.

An option is declared with `option()`: its ansible-core spec keys (type, elements, default, choices, ...), its
doc line, and what ansible-core cannot say (a range, `minimum`/`maximum`; an example for the refusal). A dict
option declares its fields in `options`, recursively. `argument_spec()` makes ansible-core's argument spec
from declarations (the modules' specs; the roles' argument specs are checked against them by
tests/unit/test_schemas.py), and `declaration_problems()` refuses a value the way a newcomer reads best: every
unknown key with the field it is closest to ("did you mean budget?"), every value of the wrong type, outside
its choices or out of its range, each naming where it is.
"""

from __future__ import annotations

import difflib
import re

from ansible.module_utils.common.parameters import DEFAULT_TYPE_VALIDATORS

# The keys of a declaration that ansible-core's argument spec takes; the rest are ours (doc, range, example).
SPEC_KEYS = ("type", "elements", "required", "default", "choices", "aliases", "no_log")
# What a value of each type is, in a refusal.
TYPE_WORDS = {
    "str": "a string",
    "path": "a path (a string)",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "list": "a list",
    "dict": "a mapping",
}


def option(
    type_: str, doc: str, default=None, per_service: bool = False, doc_default: str | None = None, **spec
) -> dict:
    """One option: its ansible-core spec keys, its doc line, whether a service may set it in `health` (the
    gate's options), and optionally `options` (a dict's fields, declared the same way), `allowed` (choices this
    module's check refuses others of, not ansible-core's: its refusal names the service), `minimum`, `maximum`,
    `check` (a function of the value as written that returns what is wrong with it, or None) and `example` (shown
    when a value of the wrong type is refused). A dict whose keys are names of the user's (an environment) declares
    `keys` (a regular expression every key matches, and `keys_doc`, what it says) and `values` (one declaration
    every value meets) instead of `options`."""
    declared = dict(spec, type=type_, doc=doc, per_service=per_service)
    if default is not None:
        declared["default"] = default
    if doc_default is not None:
        declared["doc_default"] = doc_default
    return declared


def argument_spec(options: dict) -> dict:
    """ansible-core's argument spec of declared options, their fields included (a fresh copy: ansible-core
    fills defaults into it)."""
    spec = {}
    for name, declared in options.items():
        entry = {key: declared[key] for key in SPEC_KEYS if key in declared}
        if isinstance(entry.get("default"), (list, dict)):
            entry["default"] = type(entry["default"])(entry["default"])
        if declared.get("options"):
            entry["options"] = argument_spec(declared["options"])
        spec[name] = entry
    return spec


def without(options: dict, *keys: str) -> dict:
    """Declarations with some keys left out (e.g. a service's `health` is the gate's options without defaults)."""
    return {
        name: {key: value for key, value in declared.items() if key not in keys} for name, declared in options.items()
    }


def closest(name, names) -> str | None:
    """The declared name a misspelt one is closest to, or None when none is close."""
    found = difflib.get_close_matches(str(name), list(names), n=1, cutoff=0.6)
    return found[0] if found else None


def declaration_problems(value: dict, options: dict, where: str) -> list:
    """What is wrong with a mapping against its declared fields, recursively; each problem starts with
    `where` (e.g. "ct200: sglang_services[0] (coder)") and names the field by its path (speculative.budget).
    Unset fields (None) are left to the rules that need them (required, defaults)."""
    return _mapping_problems(value, options, where, "")


def missing_problems(value: dict, options: dict, where: str) -> list:
    """The required fields the mapping leaves unset, each named with its doc line (ansible-core's own check says
    "missing required arguments" without saying which mapping of a list it is)."""
    return [
        "%s: %s is not set; it is required (%s)" % (where, name, declared["doc"])
        for name, declared in options.items()
        if declared.get("required") and value.get(name) is None
    ]


def well_declared(value: dict, options: dict) -> dict:
    """The mapping without what declaration_problems refuses (unknown fields, values of the wrong type, outside
    their choices or range; a mapping's good fields kept), so that the rules that read several fields read
    declared values only, and say nothing twice."""
    kept = {}
    for name, field in value.items():
        declared = options.get(name)
        if declared is None:
            continue
        if declared["type"] == "dict" and declared.get("options") and isinstance(field, dict):
            kept[name] = well_declared(field, declared["options"])
        elif field is None or not _value_problems(field, declared, "", name):
            kept[name] = field
    return kept


def _mapping_problems(value: dict, options: dict, where: str, path: str) -> list:
    problems = []
    unknown = [key for key in value if key not in options]
    if unknown:
        problems.append(
            "%s has unknown field(s) %s; its fields are %s%s"
            % (
                "%s: %s" % (where, path.rstrip(".")) if path else where,
                ", ".join(repr(key) for key in unknown),
                ", ".join(options),
                _hint(unknown, options),
            )
        )
    for name, declared in options.items():
        if value.get(name) is not None:
            problems.extend(_value_problems(value[name], declared, where, path + name))
    return problems


def _hint(unknown: list, options: dict) -> str:
    """ "; did you mean budget?" for one unknown key, "; did you mean budget for 'budjet', port for 'prot'?" for
    several; "" when none is close to a field."""
    close = [(key, closest(key, options)) for key in unknown]
    close = [(key, name) for key, name in close if name]
    if not close:
        return ""
    if len(unknown) == 1:
        return "; did you mean %s?" % close[0][1]
    return "; did you mean %s?" % ", ".join("%s for %r" % (name, key) for key, name in close)


def _value_problems(value, declared: dict, where: str, path: str) -> list:
    kind = declared["type"]
    try:
        converted = _converted(value, kind)
    except (TypeError, ValueError):
        example = " (e.g. %s)" % declared["example"] if declared.get("example") else ""
        what = TYPE_WORDS.get(kind, kind)
        if kind == "dict" and declared.get("options"):
            what = "a mapping of %s" % ", ".join(declared["options"])
        return ["%s: %s is %r; it must be %s%s" % (where, path, value, what, example)]
    if kind == "list" and declared.get("elements"):
        element = dict(declared, type=declared["elements"])
        element.pop("elements")
        problems = []
        for position, item in enumerate(converted):
            if isinstance(item, dict) and declared.get("options"):
                problems.extend(_mapping_problems(item, declared["options"], where, "%s[%d]." % (path, position)))
            elif item is not None:
                problems.extend(_value_problems(item, element, where, "%s[%d]" % (path, position)))
        return problems
    if kind == "dict" and declared.get("options"):
        return _mapping_problems(converted, declared["options"], where, path + ".")
    if kind == "dict" and declared.get("values"):
        return _entries_problems(converted, declared, where, path)
    choices = declared.get("choices") or declared.get("allowed")
    if choices and converted not in choices:
        return ["%s: %s %r is not one of %s" % (where, path, value, ", ".join(map(str, choices)))]
    low, high = declared.get("minimum"), declared.get("maximum")
    if (low is not None and converted < low) or (high is not None and converted > high):
        return ["%s: %s is %r; it must be from %s to %s" % (where, path, value, low, high)]
    problem = declared["check"](value) if declared.get("check") else None
    return ["%s: %s: %s" % (where, path, problem)] if problem else []


def _entries_problems(value: dict, declared: dict, where: str, path: str) -> list:
    """A mapping of names of the user's: every key matches `keys`, every value meets `values` (unset included)."""
    problems = []
    for key, item in value.items():
        if declared.get("keys") and not (isinstance(key, str) and re.fullmatch(declared["keys"], key)):
            problems.append("%s: %s has the key %r; %s" % (where, path, key, declared["keys_doc"]))
        elif item is None:
            problems.append("%s: %s.%s is unset; give it a value" % (where, path, key))
        else:
            problems.extend(_value_problems(item, declared["values"], where, "%s.%s" % (path, key)))
    return problems


def _converted(value, kind: str):
    """The value as ansible-core converts it for the type (so what a module accepts, this accepts), except that
    a mapping or a list is never a string: ansible-core would print it into one."""
    if kind == "raw":
        return value
    if kind in ("str", "path") and isinstance(value, (dict, list)):
        raise TypeError("%r is no string" % (value,))
    return DEFAULT_TYPE_VALIDATORS[kind](value)
