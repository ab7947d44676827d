"""The guard's decisions (module_utils/guard.py): when a DDTREE service falls back, the hold-down, and what
the fallback runs."""

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils.guard import (
    GUARD_SETTINGS,
    decide,
    declared_speculative,
    dflash_reference,
    fallback_holds,
    fallback_services,
    guard_problems,
    guard_settings,
    guard_state,
    history_record,
    live_numbers,
    parse_metrics,
    release_reference,
    summarize_probe,
    unit_algorithm,
    watched,
)

NOW = 1_800_000_000.0
SETTINGS = guard_settings({})
AUTOTUNE = {
    "current": {
        "release_id": "0123456789ab",
        "tuned_at": "2026-12-04T10:00:00Z",
        "measurements": [
            {"algorithm": "DFLASH", "concurrency": 1, "tokens_per_second": 100.0, "accept_length": 4.0},
            {"algorithm": "DFLASH", "concurrency": 16, "tokens_per_second": 960.0, "accept_length": 3.8},
            {"algorithm": "DDTREE", "budget": 8, "top_k": 4, "concurrency": 1, "tokens_per_second": 120.0},
        ],
    }
}
METRICS = {
    "format": 2,
    "records": [
        {"release_id": "aaaaaaaaaaaa", "tokens_per_second": 50.0, "accept_length": 2.0},
        {"release_id": "0123456789ab", "tokens_per_second": 110.0, "accept_length": 4.4, "recorded_at": "t"},
    ],
}


def live(tokens_per_second=115.0, accept=4.5, algorithm="DDTREE", running=0):
    return {
        "algorithm": algorithm,
        "tokens_per_second": tokens_per_second,
        "accept_length": accept,
        "accept_length_source": "probe",
        "load": running + 1,
    }


def test_the_defaults_are_the_declared_ones_and_a_service_may_set_each():
    assert SETTINGS == {name: spec.get("default") for name, spec in GUARD_SETTINGS.items()}
    assert guard_settings({"guard": {"hold_down": 60}})["hold_down"] == 60
    assert guard_settings({"guard": {"hold_down": 60}})["margin"] == GUARD_SETTINGS["margin"]["default"]
    # As ansible-core hands them over: every sub-option a service did not set is None.
    assert guard_settings({"guard": dict.fromkeys(GUARD_SETTINGS)}) == SETTINGS


@pytest.mark.parametrize(
    "guard, expected",
    [
        ({}, []),
        ({"margin": 1.0}, ["x: guard.margin is 1.0; it must be a number from 0 up to, not including, 1"]),
        (
            {"collapse_ratio": -0.1},
            ["x: guard.collapse_ratio is -0.1; it must be a number from 0 up to, not including, 1"],
        ),
        ({"hold_down": -1}, ["x: guard.hold_down is -1; it must be a number of seconds >= 0"]),
        (dict.fromkeys(GUARD_SETTINGS), []),
        ({"fallback": "previous"}, ["x: guard.fallback is 'previous'; it must be one of dflash"]),
        ({"probe_requests": 0}, ["x: guard.probe_requests is 0; it must be >= 1"]),
    ],
)
def test_bad_settings_are_named_with_their_value(guard, expected):
    assert guard_problems({"guard": guard}, "x") == expected


def test_only_ddtree_services_with_the_guard_on_are_watched():
    assert watched({"speculative": {"algorithm": "DDTREE", "budget": 8}})
    assert watched({"speculative": {"algorithm": "DDTREE", "autotune": {}}})
    assert not watched({"speculative": {"algorithm": "DDTREE"}, "guard": {"enabled": False}})
    assert not watched({"speculative": {"algorithm": "DFLASH"}})
    # A service across hosts switches on every node at once (a rollout); one host's guard leaves it alone.
    assert not watched({"speculative": {"algorithm": "DDTREE"}, "nodes": {"hosts": ["ct200", "ct129"]}})
    assert not watched({})


def test_dflash_reference_is_the_nearest_declared_load_at_or_below_per_request():
    assert dflash_reference(AUTOTUNE, 1)["tokens_per_second"] == 100.0
    assert dflash_reference(AUTOTUNE, 8)["concurrency"] == 1
    at16 = dflash_reference(AUTOTUNE, 20)
    assert (at16["concurrency"], at16["tokens_per_second"], at16["accept_length"]) == (16, 60.0, 3.8)
    assert dflash_reference(None, 1) is None
    failed = {
        "current": {"measurements": [{"algorithm": "DFLASH", "concurrency": 1, "error": "x", "tokens_per_second": 9}]}
    }
    assert dflash_reference(failed, 1) is None
    only16 = {"current": {"measurements": [{"algorithm": "DFLASH", "concurrency": 16, "tokens_per_second": 320.0}]}}
    assert dflash_reference(only16, 1)["concurrency"] == 16


def test_release_reference_is_the_gates_last_record_of_this_release():
    assert release_reference(METRICS, "0123456789ab")["accept_length"] == 4.4
    assert release_reference(METRICS, "bbbbbbbbbbbb") is None
    assert release_reference(None, "0123456789ab") is None


def test_parse_metrics_sums_label_sets_and_skips_comments_and_buckets():
    text = (
        "# HELP sglang:spec_accept_length x\n# TYPE sglang:spec_accept_length gauge\n"
        'sglang:spec_accept_length{model_name="m",tp_rank="0"} 1.25\n'
        'sglang:num_running_reqs{tp_rank="0"} 2.0\nsglang:num_running_reqs{tp_rank="1"} 1.0\n'
        'sglang:ttft_seconds_bucket{le="0.1"} 3.0\nbroken line\n'
    )
    assert parse_metrics(text) == {"sglang:spec_accept_length": 1.25, "sglang:num_running_reqs": 3.0}
    assert parse_metrics(None) == {}


def test_the_probe_summary_weighs_requests_by_tokens_and_counts_failures():
    replies = [
        {"completion_tokens": 60, "seconds": 1.0, "accept_length": 3.0, "verify_steps": 20},
        {"completion_tokens": 40, "seconds": 1.0, "accept_length": 1.0, "verify_steps": 40},
        {"error": "timed out after 60.0 s"},
    ]
    summary = summarize_probe(replies)
    assert summary == {
        "requests": 3,
        "failed": 1,
        "tokens_per_second": 50.0,
        "accept_length": round(100 / 60, 3),
        "errors": ["timed out after 60.0 s"],
    }
    assert summarize_probe([{"error": "refused"}])["tokens_per_second"] is None


def test_live_numbers_prefer_the_probes_acceptance_then_metrics_then_server_info():
    info = {"speculative_algorithm": "DDTREE", "internal_states": [{"avg_spec_accept_length": 4.0}]}
    probe = {"tokens_per_second": 80.0, "accept_length": 1.1}
    metrics = {"sglang:spec_accept_length": 2.0, "sglang:num_running_reqs": 3.0}
    assert live_numbers(info, metrics, probe)["accept_length_source"] == "probe"
    assert live_numbers(info, metrics, probe)["load"] == 4
    assert live_numbers(info, metrics, {"tokens_per_second": 80.0})["accept_length"] == 2.0
    no_metrics = live_numbers(info, None, {"tokens_per_second": 80.0})
    assert (no_metrics["accept_length"], no_metrics["accept_length_source"], no_metrics["load"]) == (
        4.0,
        "server_info",
        1,
    )
    assert live_numbers({"speculative_algorithm": None}, None, probe)["algorithm"] == "NONE"


def test_a_healthy_ddtree_is_kept():
    decision = decide(
        SETTINGS, live(), dflash_reference(AUTOTUNE, 1), release_reference(METRICS, "0123456789ab"), None, NOW
    )
    assert decision["action"] == "keep"


def test_ddtree_below_dflash_by_more_than_the_margin_switches():
    decision = decide(SETTINGS, live(tokens_per_second=94.0), dflash_reference(AUTOTUNE, 1), None, None, NOW)
    assert decision["action"] == "switch"
    assert (
        "tokens/s 94.0 per request is below DFLASH's 100.0 recorded on this host at concurrency 1"
        in decision["reasons"][0]
    )
    assert decision["hold_until"] == NOW + SETTINGS["hold_down"]
    # Within the margin: kept.
    assert (
        decide(SETTINGS, live(tokens_per_second=95.5), dflash_reference(AUTOTUNE, 1), None, None, NOW)["action"]
        == "keep"
    )


def test_the_load_picks_dflashs_numbers_at_that_concurrency():
    # 58 tokens/s per request: below DFLASH's 100 at one request, above its 60 x 0.95 = 57 per request at 16.
    loaded = live(tokens_per_second=58.0, running=19)
    assert decide(SETTINGS, loaded, dflash_reference(AUTOTUNE, loaded["load"]), None, None, NOW)["action"] == "keep"
    alone = live(tokens_per_second=58.0)
    assert decide(SETTINGS, alone, dflash_reference(AUTOTUNE, alone["load"]), None, None, NOW)["action"] == "switch"


def test_a_collapsed_acceptance_switches_against_the_releases_own_record():
    decision = decide(
        SETTINGS, live(tokens_per_second=None, accept=1.05), None, release_reference(METRICS, "0123456789ab"), None, NOW
    )
    assert decision["action"] == "switch"
    assert decision["reasons"] == [
        "acceptance length 1.05 (probe) collapsed below 50% of the 4.40 this release's gate recorded (2.20)"
    ]
    # Without the release's record, DFLASH's recorded acceptance is the yardstick.
    assert (
        "DFLASH's tuning"
        in decide(SETTINGS, live(accept=1.05), dflash_reference(AUTOTUNE, 1), None, None, NOW)["reasons"][-1]
    )
    # Above the ratio: kept.
    assert (
        decide(SETTINGS, live(accept=2.3), None, release_reference(METRICS, "0123456789ab"), None, NOW)["action"]
        == "keep"
    )


def test_unreachable_metrics_change_nothing_and_say_so():
    decision = decide(SETTINGS, None, None, None, None, NOW, unreachable="GET /server_info: ConnectionRefusedError")
    assert decision["action"] == "unknown"
    assert "could not be read (GET /server_info: ConnectionRefusedError); nothing changes" in decision["reasons"][0]
    empty = decide(SETTINGS, live(tokens_per_second=None, accept=None), dflash_reference(AUTOTUNE, 1), None, None, NOW)
    assert empty["action"] == "unknown"


def test_a_service_on_its_fallback_is_kept_the_guard_never_switches_back():
    state = guard_state(None, {"reasons": ["collapsed"]}, live(), NOW - 10, "0123456789ab")
    decision = decide(SETTINGS, live(algorithm="DFLASH", accept=4.0), dflash_reference(AUTOTUNE, 1), None, state, NOW)
    assert decision["action"] == "keep"
    assert "runs DFLASH, not DDTREE (the guard switched it at" in decision["reasons"][0]


def test_the_hold_down_stops_a_second_switch_and_ends():
    state = guard_state(None, {"reasons": ["collapsed"]}, live(), NOW - 600, "0123456789ab")
    bad = live(tokens_per_second=50.0)
    held = decide(dict(SETTINGS, hold_down=3600), bad, dflash_reference(AUTOTUNE, 1), None, state, NOW)
    assert held["action"] == "hold"
    assert held["hold_until"] == NOW + 3000
    assert held["reasons"][-1].startswith("held down: the guard switched this service at ")
    assert (
        decide(dict(SETTINGS, hold_down=300), bad, dflash_reference(AUTOTUNE, 1), None, state, NOW)["action"]
        == "switch"
    )


def test_nothing_recorded_keeps_and_says_there_is_no_yardstick():
    decision = decide(SETTINGS, live(accept=1.0), None, None, None, NOW)
    assert decision["action"] == "keep"
    assert "nothing recorded to compare with" in decision["reasons"][1]


def test_the_fallback_runs_dflash_with_everything_else_as_declared():
    services = [
        {
            "name": "coder",
            "speculative": {"algorithm": "DDTREE", "budget": 15, "top_k": 8},
            "release": "abcdef1",
            "port": 1,
        },
        {"name": "chat", "speculative": {"algorithm": "NEXTN"}, "port": 2},
    ]
    switched = fallback_services(services, ["coder"])
    assert switched[0] == {"name": "coder", "speculative": {"algorithm": "DFLASH"}, "release": "candidate", "port": 1}
    assert switched[1] is services[1]
    assert services[0]["speculative"]["algorithm"] == "DDTREE"


def test_the_state_and_the_history_line_say_when_from_what_and_why():
    decision = {"action": "switch", "reasons": ["a", "b"]}
    state = guard_state({"switches": [{"at": "old"}] * 25}, decision, live(), NOW, "0123456789ab")
    assert state["last_switch"]["epoch"] == NOW
    assert state["last_switch"]["reason"] == "a; b"
    assert state["last_switch"]["from"] == {"algorithm": "DDTREE", "release_id": "0123456789ab", "speculative": None}
    assert len(state["switches"]) == 20
    record = history_record("coder", decision, live(), {"dflash": None}, "0123456789ab", NOW)
    assert (record["event"], record["to"], record["reasons"]) == ("guard", {"algorithm": "DFLASH"}, ["a", "b"])


def test_the_units_flags_say_what_it_runs_where_sglangs_record_says_dflash_for_ddtree():
    exec_start = (
        "{ path=/opt/sglang/services/coder/current/stack/bin/python ; argv[]=/opt/sglang/services/coder/current/stack/"
        "bin/python /opt/sglang/libexec/sglang_launch.py sglang.launch_server --model-path /m --speculative-algorithm "
        "DDTREE --speculative-ddtree-budget 15 ; ignore_errors=no ; start_time=[n/a] }"
    )
    assert unit_algorithm(exec_start) == "DDTREE"
    assert unit_algorithm("{ argv[]=python x --speculative-algorithm=dflash }") == "DFLASH"
    assert unit_algorithm("{ argv[]=python x --port 1 }") == "NONE"
    assert unit_algorithm("") is None
    info = {"speculative_algorithm": "DFLASH"}
    assert live_numbers(info, None, {}, "DDTREE")["algorithm"] == "DDTREE"
    assert live_numbers(info, None, {})["algorithm"] == "DFLASH"


def test_a_switch_holds_across_rollouts_while_the_declaration_is_the_one_it_switched_away_from():
    coder = {"name": "coder", "speculative": {"algorithm": "DDTREE", "budget": 15, "top_k": 8, "autotune": None}}
    decision = {"action": "switch", "reasons": ["collapsed"]}
    state = guard_state(None, decision, live(), NOW, "0123456789ab", declared_speculative(coder))
    assert state["fallback"]["from"]["speculative"] == {"algorithm": "DDTREE", "budget": 15, "top_k": 8}
    why = fallback_holds(state, coder, "/var/lib/sglang/coder/guard.json")
    assert "stays on DFLASH until its speculative settings change or /var/lib/sglang/coder/guard.json" in why
    assert "(collapsed)" in why
    # Another declaration is DDTREE worth trying again; no switch, or a guard turned off, leaves it as declared.
    assert fallback_holds(state, dict(coder, speculative={"algorithm": "DDTREE", "budget": 31, "top_k": 8})) is None
    assert fallback_holds(None, coder) is None and fallback_holds({"switches": []}, coder) is None
    assert fallback_holds(state, dict(coder, guard={"enabled": False})) is None
    # A record without the declaration (written before it was kept) holds for any DDTREE declaration.
    old = {"fallback": {"at": "then", "from": {"algorithm": "DDTREE"}, "reason": "slow"}}
    assert fallback_holds(old, coder)
