# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The health gate's options, declared once: type, default and one doc line each.

ddtree.sglang.sglang_health's argument spec is made from this; the per-service `health` settings
(service_plan's and the role's argument specs) are the options marked `per_service`; the other modules that
wait for a start (service_autotune, service_autotune_measure) take start_timeout's default from here;
docs/health-gate.md's option table is generated from it (`python -m` this module's `options_table`, see
tests/unit/test_schemas.py), and the module's DOCUMENTATION and the role's argument specs are checked
against it by that test.
"""

from __future__ import annotations

from ansible_collections.ddtree.sglang.plugins.module_utils.schema import argument_spec, option, without

DEFAULT_PROMPTS = [
    "List the first ten prime numbers, separated by commas.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Translate into German and Japanese: The weather is nice today.",
]


GATE_OPTIONS = {
    "name": option("str", "service name; the unit is `sglang-<name>.service`", required=True),
    "host": option("str", "listen address (`0.0.0.0`/`::` are reached via `127.0.0.1`)", default="127.0.0.1"),
    "port": option("int", "listen port", default=30000),
    "model": option(
        "str", "served model name; part of the key of baselines and metrics", doc_default="first of `/v1/models`"
    ),
    "api_key": option(
        "str", "sent as `Authorization: Bearer` to `/v1/*` and `/server_info`; never returned", no_log=True
    ),
    "since": option(
        "str",
        "journal start, as `journalctl --since` takes it; pass the time recorded before the restart",
        doc_default="unit's `InactiveExitTimestamp`",
    ),
    "poll_interval": option("float", "seconds between looks at unit, journal and port", default=2.0),
    "no_progress_timeout": option(
        "float", "seconds without a progress marker before `no_progress`", default=120.0, per_service=True
    ),
    "start_timeout": option("float", "seconds until the port must answer", default=900.0, per_service=True),
    "health_timeout": option("float", "seconds after the port opened for `/health` to answer 200", default=30.0),
    "health_path": option(
        "str", "health endpoint (both generate a token)", default="/health", choices=["/health", "/health_generate"]
    ),
    "request_timeout": option("float", "seconds one chat/baseline request may take", default=60.0),
    "chat_prompt": option(
        "str",
        "the chat stage's user message",
        default="In one sentence: what is the capital of France, and which river runs through it?",
    ),
    "chat_max_tokens": option("int", "the chat stage's `max_tokens`", default=32, no_log=False),
    "prompts": option(
        "list",
        "greedy baseline prompts; `[]` skips generations",
        default=DEFAULT_PROMPTS,
        elements="str",
        doc_default="3 fixed prompts (primes, Python, translation)",
    ),
    "max_tokens": option("int", "`max_tokens` of each baseline generation", default=64, no_log=False),
    "baseline_file": option("path", "baseline JSON on the host"),
    "fleet_baselines": option(
        "dict",
        "the fleet's baselines (the controller's file, [The fleet's baselines]"
        "(#the-fleets-baselines-a-blank-hosts-first-release)): the reference for what `baseline_file` has none of",
    ),
    "record_baseline": option("bool", "record missing baselines when every stage passed", default=True),
    "baseline_tolerance": option(
        "float", "share of the baseline's length allowed to differ at the end", default=0.0, per_service=True
    ),
    "min_tokens_per_second": option("float", "floor for tokens/s", per_service=True, no_log=False),
    "min_accept_length": option("float", "floor for the acceptance length", per_service=True),
    "accept_length_from": option(
        "str",
        "`generate`: always one `POST /generate` request's `meta_info` (two servers compared on the same request)",
        default="server_info",
        choices=["server_info", "generate"],
    ),
    "previous": option("dict", "previous release's `tokens_per_second`, `accept_length` (beats `metrics_file`)"),
    "metrics_file": option("path", "metrics JSON on the host (previous numbers; recording)"),
    "max_regression": option("float", "largest allowed drop from the previous numbers", default=0.5, per_service=True),
    "record_metrics": option("bool", "append this run's numbers to `metrics_file` (needs it)", default=False),
    "release_id": option(
        "str",
        "the release gated (alias `release`); stored with recorded baselines and metrics, returned for reports",
        aliases=["release"],
    ),
    "verdict_file": option(
        "path", "verdicts JSON on the host: the verdict for `release_id` is recorded there right after it, pass or fail"
    ),
    "extra_signatures": option("list", "more fatal journal substrings", default=[], elements="str"),
    "extra_progress_markers": option("list", "more progress journal substrings", default=[], elements="str"),
    "gate": option(
        "dict",
        "the service's gate settings whole (service_plan's `gate`), each an option of this module; "
        "an option set to another value than its default wins",
        default={},
    ),
    "quick": option(
        "bool",
        "the quick stages only (a bake's re-check): no baseline or performance generations, no "
        "floors, nothing recorded",
        default=False,
    ),
}

# Options that are durations: ansible-core checks their type, not their sign.
POSITIVE = ("poll_interval", "no_progress_timeout", "start_timeout", "health_timeout", "request_timeout")
# The settings a service may set for itself (its `health` field); the role passes them to every gate of it.
GATE_SETTINGS = tuple(name for name, declared in GATE_OPTIONS.items() if declared["per_service"])
# What `gate` may hold: the per-service settings, and what the plan decides per service beside them.
GATE_DICT_KEYS = GATE_SETTINGS + ("accept_length_from",)


def settings_declarations() -> dict:
    """A service's `health` fields: the gate's options marked per_service, without their defaults (unset: the
    role's or the gate's)."""
    return without({name: GATE_OPTIONS[name] for name in GATE_SETTINGS}, "default")


def settings_spec() -> dict:
    """The per-service `health` settings' spec: the gate's types, no defaults (unset: the role's or the gate's)."""
    return argument_spec(settings_declarations())


def default(name: str):
    """An option's declared default (start_timeout's, for the modules that wait for a start like the gate)."""
    return GATE_OPTIONS[name].get("default")


def merged_settings(keys, *layers: dict) -> dict:
    """The gate settings of `keys` from layers in order of precedence: each key's value is the first layer's that
    sets it (not None); a key no layer sets is left out. The one place gate settings are merged: a service's own
    over the role's (services.gate_settings), and the module's options set by hand over its `gate` over its
    defaults (with_gate)."""
    merged = {}
    for key in keys:
        value = next((layer[key] for layer in layers if (layer or {}).get(key) is not None), None)
        if value is not None:
            merged[key] = value
    return merged


def with_gate(params: dict) -> dict:
    """The module's parameters with `gate`'s settings in place of the options left at their defaults.

    An option set to another value than its default wins over `gate`. A key of `gate` that is no gate
    setting raises ValueError, naming it.
    """
    gate = params.get("gate") or {}
    unknown = sorted(set(gate) - set(GATE_DICT_KEYS))
    if unknown:
        raise ValueError(
            "gate holds %s, which %s no gate setting (settings: %s)"
            % (", ".join(unknown), "is" if len(unknown) == 1 else "are", ", ".join(GATE_DICT_KEYS))
        )
    set_by_hand = {key: params.get(key) for key in gate if params.get(key) != GATE_OPTIONS[key].get("default")}
    return dict(params, **merged_settings(gate, set_by_hand, gate))


def quick_params(params: dict) -> dict:
    """A bake's re-check: the unit, journal, /health and chat stages only, recording nothing."""
    return dict(
        params,
        prompts=[],
        baseline_file=None,
        metrics_file=None,
        record_metrics=False,
        verdict_file=None,
        min_tokens_per_second=None,
        min_accept_length=None,
        previous=None,
    )


def _cell_default(declared: dict) -> str:
    if declared.get("required"):
        return "required"
    if "doc_default" in declared:
        return declared["doc_default"]
    value = declared.get("default")
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "`%s`" % str(value).lower()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return "`%s`" % (value,)


def _cell_type(declared: dict) -> str:
    if declared.get("choices"):
        return " or ".join("`%s`" % choice for choice in declared["choices"])
    if declared["type"] == "list":
        return "list of %s" % declared.get("elements", "str")
    return declared["type"] + (" (no_log)" if declared.get("no_log") else "")


def options_table(options: dict | None = None) -> str:
    """docs/health-gate.md's option table, made from the declarations."""
    lines = ["| option | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, declared in (options or GATE_OPTIONS).items():
        lines.append("| `%s` | %s | %s | %s |" % (name, _cell_type(declared), _cell_default(declared), declared["doc"]))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(options_table())
