"""Autotune as data: the declaration's rules, the grid, the tuning key, the choice and what it becomes."""

import copy

import pytest
from service_samples import coder

from ansible_collections.ddtree.sglang.plugins.module_utils import autotune, services

CODER = coder(
    speculative={
        "algorithm": "DDTREE",
        "autotune": {
            "budgets": [4, 8, 15],
            "top_k": [4, 8],
            "concurrency": [1, 16],
            "min_gain": 0.03,
            "gpus": [2, 3],
            "port": 30100,
        },
    },
)
EIGHT = list(range(8))


def with_autotune(**fields):
    service = copy.deepcopy(CODER)
    service["speculative"]["autotune"].update(fields)
    return service


def problems_of(service):
    return services.service_problems([service], EIGHT, "ct200")


# ---- the declaration -------------------------------------------------------------------------------


def test_a_good_declaration_and_the_defaults_have_no_problems():
    assert problems_of(CODER) == []
    defaults = copy.deepcopy(CODER)
    defaults["speculative"]["autotune"] = {"gpus": [2, 3], "port": 30100}
    assert problems_of(defaults) == []
    assert autotune.declaration(defaults["speculative"]) == {
        "budgets": [7, 15, 31, 63, 127],
        "top_k": [8],
        "concurrency": [1, 16, 64],
        "min_gain": 0.03,
    }


@pytest.mark.parametrize(
    "service, message",
    [
        (
            dict(CODER, speculative={"algorithm": "DFLASH", "autotune": {}}),
            "ct200: sglang_services[0] (coder): speculative.autotune is set, but algorithm is DFLASH; autotune chooses DDTREE's budget "
            "and top_k (falling back to DFLASH by itself): set algorithm DDTREE or remove autotune",
        ),
        (
            dict(CODER, speculative={"algorithm": "DDTREE", "autotune": True}),
            "speculative.autotune is True; it must be a mapping of budgets, top_k, concurrency, min_gain, gpus, port, own_gpus "
            "(e.g. autotune: {gpus: [2, 3], port: 30100} for the default grid)",
        ),
        (
            with_autotune(budget=[4]),
            "speculative.autotune has unknown field(s) 'budget'; its fields are budgets, top_k, concurrency, min_gain, gpus, port, own_gpus",
        ),
        (
            with_autotune(budgets=[4, 0]),
            "speculative.autotune.budgets is [4, 0]; it must be a non-empty list of distinct integers >= 1",
        ),
        (with_autotune(budgets=[]), "speculative.autotune.budgets is []; it must be a non-empty list"),
        (with_autotune(budgets=8), "speculative.autotune.budgets is 8; it must be a non-empty list"),
        (
            with_autotune(top_k=[4, True]),
            "speculative.autotune.top_k is [4, True]; it must be a non-empty list of distinct integers >= 1",
        ),
        (
            with_autotune(top_k=[4, 8, 4]),
            "speculative.autotune.top_k is [4, 8, 4] and lists 4 more than once; list each value once",
        ),
        (
            with_autotune(concurrency=[0, 16]),
            "speculative.autotune.concurrency is [0, 16]; it must be a non-empty list of distinct integers >= 1",
        ),
        (
            with_autotune(min_gain=1),
            "speculative.autotune.min_gain is 1; it must be a number from 0 up to, not including, 1",
        ),
        (with_autotune(min_gain=-0.01), "speculative.autotune.min_gain is -0.01"),
        (with_autotune(min_gain="3%"), "speculative.autotune.min_gain is '3%'"),
        (
            dict(CODER, speculative=dict(CODER["speculative"], budget=15)),
            "speculative.budget 15 is fixed, but autotune chooses it: remove speculative.budget, or pin it in the grid with autotune.budgets: [15]",
        ),
        (
            dict(CODER, speculative=dict(CODER["speculative"], top_k=8)),
            "speculative.top_k 8 is fixed, but autotune chooses it: remove speculative.top_k, or pin it in the grid with autotune.top_k: [8]",
        ),
        (
            with_autotune(budgets=list(range(1, 6)), top_k=[1, 2, 3, 4]),
            "speculative.autotune spans 20 DDTREE settings (5 budgets x 4 top_k), each a server start and a measurement; list at most 16",
        ),
    ],
)
def test_each_autotune_rule_names_the_service_field_value_and_fix(service, message):
    problems = problems_of(service)
    assert any(message in problem for problem in problems), problems


def test_flags_of_a_service_that_declares_autotune_come_only_from_its_tuned_choice():
    with pytest.raises(ValueError, match="coder declares speculative.autotune"):
        services.service_flags(CODER)


# ---- the grid and the key --------------------------------------------------------------------------


def test_the_grid_is_dflash_then_every_ddtree_setting_at_every_concurrency():
    tuning = autotune.declaration(with_autotune(budgets=[15, 4], top_k=[4], concurrency=[16, 1])["speculative"])
    assert [(m["algorithm"], m["budget"], m["top_k"], m["concurrency"]) for m in autotune.measurement_plan(tuning)] == [
        ("DFLASH", None, None, 1),
        ("DFLASH", None, None, 16),
        ("DDTREE", 4, 4, 1),
        ("DDTREE", 4, 4, 16),
        ("DDTREE", 15, 4, 1),
        ("DDTREE", 15, 4, 16),
    ]


def test_the_key_is_stable_and_changes_with_each_part():
    key = autotune.tuning_key(CODER, "r1", {"prompts": "gate-4", "max_tokens": 256})
    # The same declaration in another order, and a field the key does not read: the same key.
    same = with_autotune(budgets=[15, 8, 4], concurrency=[16, 1])
    same["port"] = 31000
    assert autotune.tuning_key(same, "r1", {"max_tokens": 256, "prompts": "gate-4"}) == key
    changes = {
        "release_id": (CODER, "r2", None),
        "model": (dict(CODER, model_path="/models/coder-v2"), "r1", None),
        "drafter": (dict(CODER, draft_model_path="/models/coder-dflash-v2"), "r1", None),
        "tp_size": (dict(CODER, tp_size=1), "r1", None),
        "grid": (with_autotune(concurrency=[1, 32]), "r1", None),
        "workload": (CODER, "r1", {"prompts": "gate-4", "max_tokens": 512}),
        "server_settings": (dict(CODER, environment={"HF_TOKEN": "hf_s3cret"}), "r1", None),
    }
    for part, (service, release, workload) in changes.items():
        other = autotune.tuning_key(service, release, workload or {"prompts": "gate-4", "max_tokens": 256})
        assert other["digest"] != key["digest"], part
        assert autotune.key_changes(key, other) == [part]
    # The environment's values are in no part of the key: it may hold a token.
    assert "hf_s3cret" not in repr(autotune.tuning_key(changes["server_settings"][0], "r1"))
    assert autotune.key_changes(None, key) == sorted(key["parts"])


# ---- the choice ------------------------------------------------------------------------------------

TUNING = autotune.declaration(CODER["speculative"])  # budgets 4, 8, 15; top_k 4, 8; concurrency 1, 16; min_gain 0.03


def measured(speeds, **failures):
    """speeds: {(budget, top_k) or "DFLASH" or "NONE": (tokens/s at 1, at 16)} -> measurements."""
    result = []
    for what, values in speeds.items():
        for concurrency, value in zip((1, 16), values):
            if value is None:
                continue
            if what in ("DFLASH", "NONE"):
                result.append({"algorithm": what, "concurrency": concurrency, "tokens_per_second": value})
            else:
                result.append(
                    {
                        "algorithm": "DDTREE",
                        "budget": what[0],
                        "top_k": what[1],
                        "concurrency": concurrency,
                        "tokens_per_second": value,
                        "accept_length": 6.0,
                    }
                )
    return result


ALL_SLOWER = {
    "DFLASH": (100.0, 1000.0),
    (4, 4): (101.0, 990.0),
    (4, 8): (99.0, 1001.0),
    (8, 4): (102.0, 1020.0),
    (8, 8): (95.0, 900.0),
    (15, 4): (90.0, 800.0),
    (15, 8): (88.0, 700.0),
}


def test_the_fastest_setting_that_beats_dflash_by_min_gain_at_every_concurrency_is_chosen():
    speeds = {
        **ALL_SLOWER,
        (8, 4): (120.0, 1100.0),
        (15, 8): (140.0, 1040.0),
        (4, 8): (125.0, 1150.0),
        "NONE": (50.0, 600.0),
    }
    choice = autotune.choose(TUNING, measured(speeds))
    # (15, 8) is the fastest at one request (+40%) but only +4% at 16; (4, 8) is +25% and +15%: the best
    # worst case of one budget. A budget per load does better: 15 nodes for one request, 4 at 16.
    assert (choice["algorithm"], choice["budget"], choice["top_k"], choice["status"]) == (
        "DDTREE",
        "1:15,16:4",
        8,
        "ddtree",
    )
    assert choice["tokens_per_second"] == {"1": 140.0, "16": 1150.0}
    assert choice["gain_over_dflash"] == {"1": 0.4, "16": 0.15}
    assert choice["gain_over_none"] == {"1": 1.8, "16": 0.9167}
    assert (
        "DDTREE budget 1:15,16:4 top_k 8 is the fastest setting that beats DFLASH by min_gain +3.0%" in choice["reason"]
    )
    assert "15 at concurrency up to 1, 4 at concurrency up to 16" in choice["reason"]
    statuses = {(item["budget"], item["top_k"]): item["status"] for item in choice["settings"]}
    assert statuses == {
        (4, 4): "too_slow",
        (4, 8): "qualifies",
        (8, 4): "qualifies",
        (8, 8): "too_slow",
        (15, 4): "too_slow",
        (15, 8): "qualifies",
    }


def test_one_budget_wins_where_it_is_best_at_every_load_and_a_schedule_needs_every_level_to_beat_dflash():
    # (4, 8) is the fastest top_k-8 setting at both loads: no schedule, the single budget.
    speeds = {**ALL_SLOWER, (4, 8): (125.0, 1150.0), (15, 8): (120.0, 1040.0)}
    choice = autotune.choose(TUNING, measured(speeds))
    assert (choice["budget"], choice["top_k"]) == (4, 8)
    # The fastest budget per load, but the load of 16 is only +2% over DFLASH: the schedule does not qualify.
    speeds = {**ALL_SLOWER, (15, 4): (150.0, 900.0), (8, 4): (110.0, 1020.0)}
    choice = autotune.choose(TUNING, measured(speeds))
    assert (choice["algorithm"], choice["status"]) == ("DFLASH", "fallback")
    schedule = [item for item in choice["settings"] if item.get("levels")]
    assert schedule == [] or all(item["status"] != "qualifies" for item in schedule)
    # The tuned service runs the schedule as its flag.
    service = autotune.tuned_service(CODER, {"algorithm": "DDTREE", "budget": "1:63,16:15", "top_k": 8})
    assert service["speculative"]["budget"] == "1:63,16:15"
    with pytest.raises(ValueError, match="budget for batch size 16"):
        autotune.tuned_service(CODER, {"algorithm": "DDTREE", "budget": "1:63,16:0", "top_k": 8})


def test_a_setting_that_wins_at_one_concurrency_but_not_at_another_is_not_chosen():
    speeds = {**ALL_SLOWER, (8, 4): (150.0, 1020.0)}  # +50% at 1 request, +2% at 16
    choice = autotune.choose(TUNING, measured(speeds))
    assert (choice["algorithm"], choice["status"], choice["budget"]) == ("DFLASH", "fallback", None)
    assert choice["tokens_per_second"] == {"1": 100.0, "16": 1000.0} and choice["gain_over_dflash"] == {
        "1": 0.0,
        "16": 0.0,
    }
    assert (
        "closest: DDTREE budget 8 top_k 4, +2.0% over DFLASH at concurrency 16, less than min_gain +3.0%"
        in choice["reason"]
    )


def test_exactly_min_gain_is_enough_and_ties_go_to_the_smaller_tree():
    speeds = {**ALL_SLOWER, (8, 4): (103.0, 1030.0), (4, 4): (103.0, 1030.0)}
    choice = autotune.choose(TUNING, measured(speeds))
    assert (choice["algorithm"], choice["budget"], choice["top_k"]) == ("DDTREE", 4, 4)
    # 115 / 100 - 1 is 0.1499999999999999 in floating point: still a gain of 15%.
    fifteen = dict(TUNING, min_gain=0.15)
    choice = autotune.choose(fifteen, measured({**ALL_SLOWER, (8, 8): (115.0, 1150.0)}))
    assert (choice["algorithm"], choice["budget"], choice["top_k"]) == ("DDTREE", 8, 8)


def test_a_setting_that_failed_or_was_not_measured_everywhere_is_never_chosen():
    speeds = {**ALL_SLOWER, (15, 8): (500.0, None), (8, 8): (400.0, 4000.0)}
    measurements = measured(speeds)
    failed = next(m for m in measurements if m.get("budget") == 8 and m.get("top_k") == 8 and m["concurrency"] == 16)
    failed["error"] = "POST /generate: HTTP 500"
    choice = autotune.choose(TUNING, measurements)
    assert choice["algorithm"] == "DFLASH"
    verdicts = {(item["budget"], item["top_k"]): item for item in choice["settings"]}
    assert verdicts[(15, 8)]["status"] == "unmeasured" and verdicts[(15, 8)]["reasons"] == [
        "not measured at concurrency 16"
    ]
    assert verdicts[(8, 8)]["status"] == "failed" and verdicts[(8, 8)]["reasons"] == [
        "failed at concurrency 16: POST /generate: HTTP 500"
    ]


def test_without_dflash_at_every_concurrency_nothing_is_chosen():
    speeds = {**ALL_SLOWER, "DFLASH": (100.0, None), (8, 4): (150.0, 1500.0)}
    with pytest.raises(autotune.IncompleteMeasurements) as info:
        autotune.choose(TUNING, measured(speeds))
    assert info.value.problems == [
        "DFLASH was not measured at concurrency 16; every DDTREE setting is compared with it"
    ]
    measurements = measured(dict(ALL_SLOWER))
    measurements[0]["error"] = "the server did not start"
    with pytest.raises(
        autotune.IncompleteMeasurements, match="DFLASH's measurement at concurrency 1 failed .the server did not start."
    ):
        autotune.choose(TUNING, measurements)


def test_measurements_outside_the_grid_or_given_twice_are_refused():
    measurements = measured(ALL_SLOWER) + [
        {"algorithm": "DDTREE", "budget": 31, "top_k": 4, "concurrency": 1, "tokens_per_second": 500.0},
        {"algorithm": "DFLASH", "concurrency": 64, "tokens_per_second": 500.0},
        {"algorithm": "DDTREE", "budget": 8, "top_k": 4, "concurrency": 1, "tokens_per_second": 90.0},
    ]
    with pytest.raises(autotune.IncompleteMeasurements) as info:
        autotune.choose(TUNING, measurements)
    assert info.value.problems == [
        "measurements[14] (DDTREE budget 31 top_k 4 at concurrency 1): not in the declared grid (budgets [4, 8, 15], top_k [4, 8], concurrency [1, 16])",
        "measurements[15] (DFLASH at concurrency 64): not in the declared grid (budgets [4, 8, 15], top_k [4, 8], concurrency [1, 16])",
        "measurements[16] (DDTREE budget 8 top_k 4 at concurrency 1): measured twice; supply one measurement per setting and concurrency",
    ]


# ---- what the choice becomes -----------------------------------------------------------------------


def test_a_ddtree_choice_becomes_the_flags_and_the_gates_floor():
    choice = dict(autotune.choose(TUNING, measured({**ALL_SLOWER, (8, 4): (125.0, 1100.0)})), speed_floor=100.0)
    service = autotune.tuned_service(
        dict(CODER, speculative=dict(CODER["speculative"], allow_hybrid_unsafe=True)), choice
    )
    flags = services.service_flags(service)
    assert flags[flags.index("--speculative-algorithm") + 1] == "DDTREE"
    assert (
        flags[flags.index("--speculative-ddtree-budget") + 1] == "8"
        and flags[flags.index("--speculative-ddtree-top-k") + 1] == "4"
    )
    assert "--speculative-ddtree-allow-hybrid-unsafe" in flags
    assert services.gate_settings(service, {}) == {"min_tokens_per_second": 100.0}
    assert "autotune" in CODER["speculative"]  # the declaration itself is left as it was


def test_a_fallback_runs_dflash_without_ddtree_flags_and_an_explicit_floor_wins():
    choice = autotune.choose(TUNING, measured(ALL_SLOWER))
    choice["speed_floor"] = autotune.speed_floor(choice)
    assert choice["speed_floor"] == 80.0  # DFLASH's 100 tokens/s at one request, less 20%
    service = autotune.tuned_service(dict(CODER, health={"min_tokens_per_second": 70.0}), choice)
    flags = services.service_flags(service)
    assert flags[flags.index("--speculative-algorithm") + 1] == "DFLASH"
    assert not any(flag.startswith("--speculative-ddtree") for flag in flags)
    assert flags[flags.index("--speculative-draft-model-path") + 1] == "/models/coder-dflash"
    assert services.gate_settings(service, {})["min_tokens_per_second"] == 70.0


def test_no_floor_without_a_measurement_at_one_request_and_a_bad_choice_is_refused():
    assert autotune.speed_floor({"tokens_per_second": {"16": 1000.0}}) is None
    with pytest.raises(ValueError, match="coder: a tuned choice is DDTREE or DFLASH, not 'NONE'"):
        autotune.tuned_service(CODER, {"algorithm": "NONE"})
    with pytest.raises(ValueError, match="the tuned DDTREE choice.s budget: the budget is None"):
        autotune.tuned_service(CODER, {"algorithm": "DDTREE", "top_k": 4})


def test_the_state_keeps_the_current_tuning_and_a_short_history():
    key1, key2 = autotune.tuning_key(CODER, "r1"), autotune.tuning_key(CODER, "r2")
    choice = autotune.choose(TUNING, measured(ALL_SLOWER))
    first = autotune.state_document(
        None, autotune.tuning_record(key1, "r1", TUNING, measured(ALL_SLOWER), choice, "t1")
    )
    assert autotune.recorded_choice(first, key1)["algorithm"] == "DFLASH"
    assert autotune.recorded_choice(first, key2) is None
    assert len(first["current"]["measurements"]) == 14 and first["history"] == []
    second = autotune.state_document(first, autotune.tuning_record(key2, "r2", TUNING, [], choice, "t2"), keep=1)
    assert second["current"]["release_id"] == "r2"
    assert second["history"] == [
        {
            "key": key1["digest"],
            "release_id": "r1",
            "tuned_at": "t1",
            "choice": {"algorithm": "DFLASH", "budget": None, "top_k": None, "status": "fallback"},
        }
    ]
