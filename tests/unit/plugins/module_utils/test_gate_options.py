"""The gate's options, declared once: the module's spec, `gate` merged over defaults, a bake's quick form."""

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils import gate_options, services
from ansible_collections.ddtree.sglang.plugins.module_utils.gate_options import (
    GATE_OPTIONS,
    GATE_SETTINGS,
    argument_spec,
    default,
    merged_settings,
    quick_params,
    with_gate,
)
from ansible_collections.ddtree.sglang.plugins.modules import service_autotune, service_autotune_measure, sglang_health


def defaults():
    return {name: declared.get("default") for name, declared in GATE_OPTIONS.items()}


def test_the_modules_spec_is_the_declaration_and_start_timeouts_default_is_written_once():
    assert sglang_health.ARGUMENT_SPEC == argument_spec(GATE_OPTIONS)
    assert default("start_timeout") == 900
    assert service_autotune.ARGUMENT_SPEC["start_timeout"]["default"] == default("start_timeout")


def test_the_per_service_settings_are_the_declared_ones():
    assert set(GATE_SETTINGS) == {
        "start_timeout",
        "no_progress_timeout",
        "min_tokens_per_second",
        "min_accept_length",
        "max_regression",
        "baseline_tolerance",
    }


def test_gate_settings_replace_defaults_and_an_option_set_otherwise_wins():
    params = dict(defaults(), gate={"start_timeout": 1800, "min_accept_length": 2.5, "max_regression": 0.2})
    merged = with_gate(dict(params, max_regression=0.3))
    assert (merged["start_timeout"], merged["min_accept_length"], merged["max_regression"]) == (1800, 2.5, 0.3)


def test_merged_settings_take_each_key_from_the_first_layer_that_sets_it():
    own = {"start_timeout": 1800, "min_accept_length": None}
    role = {"start_timeout": 900, "no_progress_timeout": 120, "min_accept_length": 2.0}
    assert merged_settings(GATE_SETTINGS, own, role, None) == {
        "start_timeout": 1800,
        "no_progress_timeout": 120,
        "min_accept_length": 2.0,
    }
    # Only the keys asked for; none set anywhere: nothing, so the module's own defaults apply.
    assert merged_settings(("start_timeout",), {"max_regression": 0.2}) == {}


def test_the_plan_and_the_module_merge_gate_settings_in_the_one_function(monkeypatch):
    calls = []

    def spy(keys, *layers):
        calls.append(layers)
        return merged_settings(keys, *layers)

    monkeypatch.setattr(gate_options, "merged_settings", spy)
    own = {"name": "coder", "health": {"start_timeout": 1800}}
    assert services.gate_settings(own, {"max_regression": 0.2}) == {"start_timeout": 1800, "max_regression": 0.2}
    assert with_gate(dict(defaults(), gate={"start_timeout": 1800}))["start_timeout"] == 1800
    assert calls == [({"start_timeout": 1800}, {"max_regression": 0.2}), ({}, {"start_timeout": 1800})]


def test_a_gate_key_that_is_no_setting_is_refused_by_name():
    with pytest.raises(ValueError, match="gate holds prompts, which is no gate setting"):
        with_gate(dict(defaults(), gate={"prompts": []}))


def test_the_quick_form_generates_nothing_meets_no_floor_and_records_nothing():
    params = quick_params(
        dict(defaults(), min_accept_length=2.5, baseline_file="/b", verdict_file="/v", record_metrics=True)
    )
    assert params["prompts"] == []
    assert params["min_accept_length"] is None and params["baseline_file"] is None and params["verdict_file"] is None
    assert params["record_metrics"] is False


def test_the_measuring_module_takes_the_same_start_timeout(capsys):
    # Its spec is built in main(): read the default from the module's source instead of running it.
    source = open(service_autotune_measure.__file__).read()
    assert 'start_timeout=dict(type="float", default=gate_default("start_timeout"))' in source
