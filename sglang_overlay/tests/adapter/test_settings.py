"""DDTree settings: parsing, precedence flag > env > default, the verify window, hybrid targets."""

from __future__ import annotations

import json

import pytest

from sglang_overlay.adapter import settings as s


def test_defaults_without_flags_or_env():
    got = s.resolve_settings({}, environ={})
    assert got == s.DDTreeSettings()
    assert got.budget is None and got.top_k is None and got.allow_hybrid_unsafe is False
    assert (got.budget_source, got.top_k_source, got.allow_hybrid_unsafe_source) == ("default",) * 3


def test_env_values_are_used_and_named_as_source():
    env = {s.ENV_BUDGET: "12", s.ENV_TOP_K: " 3 ", s.ENV_ALLOW_HYBRID: "yes"}
    got = s.resolve_settings({}, environ=env)
    assert (got.budget, got.top_k, got.allow_hybrid_unsafe) == (12, 3, True)
    assert got.budget_source == s.ENV_BUDGET and got.top_k_source == s.ENV_TOP_K


def test_flag_beats_env():
    env = {s.ENV_BUDGET: "12", s.ENV_TOP_K: "3", s.ENV_ALLOW_HYBRID: "1"}
    flags = {s.DEST_BUDGET: 5, s.DEST_TOP_K: 2, s.DEST_ALLOW_HYBRID: False}
    got = s.resolve_settings(flags, environ=env)
    assert (got.budget, got.top_k, got.allow_hybrid_unsafe) == (5, 2, False)
    assert got.budget_source == s.FLAG_BUDGET and got.allow_hybrid_unsafe_source == s.FLAG_ALLOW_HYBRID


def test_flag_not_given_falls_back_to_env():
    got = s.resolve_settings({s.DEST_BUDGET: None}, environ={s.ENV_BUDGET: "9"})
    assert (got.budget, got.budget_source) == (9, s.ENV_BUDGET)


def test_empty_env_means_unset():
    got = s.resolve_settings({}, environ={s.ENV_BUDGET: "", s.ENV_TOP_K: "  "})
    assert got.budget is None and got.top_k is None


@pytest.mark.parametrize(
    "env, name, value",
    [
        ({"SGLANG_DDTREE_BUDGET": "0"}, "SGLANG_DDTREE_BUDGET", "'0'"),
        ({"SGLANG_DDTREE_BUDGET": "-3"}, "SGLANG_DDTREE_BUDGET", "'-3'"),
        ({"SGLANG_DDTREE_BUDGET": "abc"}, "SGLANG_DDTREE_BUDGET", "'abc'"),
        ({"SGLANG_DDTREE_BUDGET": "1.5"}, "SGLANG_DDTREE_BUDGET", "'1.5'"),
        ({"SGLANG_DDTREE_TOP_K": "0"}, "SGLANG_DDTREE_TOP_K", "'0'"),
        ({"SGLANG_DDTREE_ALLOW_HYBRID_UNSAFE": "maybe"}, "SGLANG_DDTREE_ALLOW_HYBRID_UNSAFE", "'maybe'"),
    ],
)
def test_bad_env_value_names_the_variable_and_value(env, name, value):
    with pytest.raises(s.DDTreeConfigError) as err:
        s.resolve_settings({}, environ=env)
    assert name in str(err.value) and value in str(err.value)


@pytest.mark.parametrize("dest, flag", [(s.DEST_BUDGET, s.FLAG_BUDGET), (s.DEST_TOP_K, s.FLAG_TOP_K)])
def test_bad_flag_value_names_the_flag(dest, flag):
    with pytest.raises(s.DDTreeConfigError) as err:
        s.resolve_settings({dest: 0}, environ={})
    assert flag in str(err.value) and "0" in str(err.value)


def test_bool_spellings():
    for text in ("1", "true", "TRUE", "Yes", "on"):
        assert s.parse_bool(text, "X") is True
    for text in ("0", "false", "No", "OFF"):
        assert s.parse_bool(text, "X") is False


def test_window_default_budget_fills_the_window():
    got = s.resolve_for_window(s.DDTreeSettings(), 16)
    assert (got.budget, got.window, got.verify_width, got.effective_top_k) == (15, 16, 16, 8)


def test_window_explicit_budget_and_effective_top_k():
    got = s.resolve_for_window(s.DDTreeSettings(budget=4, top_k=8), 16)
    assert (got.budget, got.verify_width, got.effective_top_k) == (4, 5, 4)


def test_budget_beyond_the_block_widens_the_verify_window():
    got = s.resolve_for_window(s.resolve_settings({s.DEST_BUDGET: 63}, environ={}), 16)
    assert (got.budget, got.window, got.block, got.verify_width) == (63, 64, 16, 64)
    assert got.top_k == 8 and got.for_batch(7) is got
    wide = s.resolve_for_window(s.resolve_settings({}, environ={s.ENV_BUDGET: "255"}), 16)
    assert (wide.window, wide.top_k) == (256, 32)


def test_budget_limits_name_the_flag_and_value():
    with pytest.raises(s.DDTreeConfigError) as err:
        s.resolve_settings({s.DEST_BUDGET: 512}, environ={})
    assert s.FLAG_BUDGET in str(err.value) and "512" in str(err.value) and str(s.MAX_BUDGET) in str(err.value)
    with pytest.raises(s.DDTreeConfigError, match=s.ENV_TOP_K):
        s.resolve_settings({}, environ={s.ENV_TOP_K: "65"})


@pytest.mark.parametrize(
    "raw",
    [
        "1:127,4:63,16:15,48:7",
        " 16:15 , 1:127,48:7,4:63",
        '{"1": 127, "4": 63, "16": 15, "48": 7}',
        {1: 127, 4: 63, 16: 15, 48: 7},
        [[1, 127], [4, 63], [16, 15], [48, 7]],
    ],
)
def test_schedule_spellings(raw):
    assert s.parse_budget(raw, "X") == ((1, 127), (4, 63), (16, 15), (48, 7))


@pytest.mark.parametrize(
    "raw, words",
    [
        ("1:127,1:63", "appears twice"),
        ("1:127,4", "BATCH_SIZE:BUDGET"),
        ("0:15", "batch size"),
        ("4:0", "budget for batch size 4"),
        ("1:600", "at most"),
        ("{nope", "JSON object"),
        ("", "integer"),
    ],
)
def test_bad_schedules_say_what_is_wrong(raw, words):
    with pytest.raises(s.DDTreeConfigError) as err:
        s.parse_budget(raw, s.FLAG_BUDGET)
    assert words in str(err.value) and s.FLAG_BUDGET in str(err.value)


def test_schedule_windows_by_batch_size():
    req = s.resolve_settings({s.DEST_BUDGET: "1:127,4:63,16:15,48:7"}, environ={})
    got = s.resolve_for_window(req, 16)
    assert (got.window, got.block, got.budget, got.top_k) == (128, 16, 127, 16)
    windows = {bs: got.for_batch(bs).window for bs in (1, 2, 4, 5, 16, 17, 48, 64)}
    assert windows == {1: 128, 2: 64, 4: 64, 5: 16, 16: 16, 17: 8, 48: 8, 64: 8}
    assert got.for_batch(20).block == 16 and got.for_batch(20).schedule == ()
    assert got.window_batch_sizes([1, 2, 3, 4, 8, 16, 24, 32, 48]) == {
        128: [1],
        64: [2, 3, 4],
        16: [8, 16],
        8: [24, 32, 48],
    }
    assert s.ResolvedDDTree.from_dict(json.loads(json.dumps(got.to_dict()))) == got
    assert s.format_budget(got.schedule) == "1:127,4:63,16:15,48:7"


def test_verify_memory_refusal_names_the_flag_the_limit_and_what_fits():
    resolved = s.resolve_for_window(s.resolve_settings({s.DEST_BUDGET: 511}, environ={}), 16)
    gib = 1 << 30
    with pytest.raises(s.DDTreeConfigError) as err:
        s.check_verify_memory(resolved, s.FLAG_BUDGET, 48, 40960, 151936, 4 * gib)
    text = str(err.value)
    assert s.FLAG_BUDGET in text and "511" in text and "4.0 GiB" in text and "largest single budget" in text
    fits = int(text.split("largest single budget that fits is ")[1].split(";")[0])
    one = s.ResolvedDDTree(fits, 8, False, fits + 1, 16)
    assert s.check_verify_memory(one, "X", 48, 40960, 151936, 4 * gib) <= 4 * gib
    over = s.ResolvedDDTree(fits + 1, 8, False, fits + 2, 16)
    with pytest.raises(s.DDTreeConfigError):
        s.check_verify_memory(over, "X", 48, 40960, 151936, 4 * gib)
    # A schedule that gives the wide window to one request only fits where the single budget did not.
    sched = s.resolve_for_window(s.resolve_settings({s.DEST_BUDGET: "1:127,48:7"}, environ={}), 16)
    assert s.windows_with_batch_sizes(sched, 48) == {128: 48, 8: 48}


def test_block_must_exist():
    with pytest.raises(s.DDTreeConfigError, match="block"):
        s.resolve_for_window(s.DDTreeSettings(), None)


def test_settings_round_trip_as_plain_dicts():
    req = s.resolve_settings({s.DEST_BUDGET: 3}, environ={s.ENV_TOP_K: "2"})
    assert s.DDTreeSettings.from_dict(json.loads(json.dumps(req.to_dict()))) == req
    res = s.resolve_for_window(req, 8)
    assert s.ResolvedDDTree.from_dict(res.to_dict()) == res


@pytest.mark.parametrize(
    "config, expect",
    [
        ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, None),
        ({"model_type": "qwen3"}, None),
        ({"model_type": "qwen3_next"}, "qwen3_next"),
        ({"model_type": "nemotron_h", "hybrid_override_pattern": "M-M*-"}, "nemotron_h"),
        ({"model_type": "custom", "hybrid_override_pattern": "M*M*"}, "hybrid_override_pattern"),
        ({"model_type": "custom", "layer_types": ["full_attention", "linear_attention"]}, "linear_attention"),
        ({"model_type": "custom", "layer_types": ["full_attention", "sliding_attention"]}, None),
        ({"model_type": "llava", "text_config": {"model_type": "jamba"}}, "text_config"),
    ],
)
def test_hybrid_detection(config, expect):
    reason = s.hybrid_target_reason(config)
    if expect is None:
        assert reason is None
    else:
        assert reason is not None and expect in reason


def test_hybrid_target_refused_unless_allowed(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_next"}))
    with pytest.raises(s.DDTreeConfigError) as err:
        s.check_hybrid_target(str(tmp_path), s.DDTreeSettings())
    assert s.FLAG_ALLOW_HYBRID in str(err.value) and str(tmp_path) in str(err.value)
    allowed = s.DDTreeSettings(allow_hybrid_unsafe=True)
    assert "qwen3_next" in s.check_hybrid_target(str(tmp_path), allowed)


def test_hub_ids_and_plain_targets_pass(tmp_path):
    assert s.check_hybrid_target("Qwen/Qwen3-8B", s.DDTreeSettings()) is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert s.check_hybrid_target(str(tmp_path), s.DDTreeSettings()) is None
