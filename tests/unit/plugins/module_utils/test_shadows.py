"""Shadow services at run time: who waits for its shadow, and when a shadow's candidate is promoted."""

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils.shadows import (
    compare_acceptance,
    compare_outputs,
    compare_speed,
    hold_for_shadows,
    shadow_verdict,
)

RELEASES = {"aaaaaaaaaaaa": {"overlay": True}, "bbbbbbbbbbbb": {"overlay": True}, "cccccccccccc": {"overlay": False}}
SERVICES = [
    {"name": "coder", "algorithm": "DDTREE"},
    {"name": "coder-shadow", "algorithm": "DDTREE", "shadow_of": "coder"},
]
CANDIDATE = {
    "release_id": "bbbbbbbbbbbb",
    "follows": "candidate",
    "overlay": True,
    "reason": "follows the rollout's candidate",
}
PROMPTS = ["List the first ten prime numbers.", "Write fib(n)."]


def gate(release_id, texts, tokens_per_second, accept_length, passed=True, **extra):
    return dict(
        {
            "passed": passed,
            "release_id": release_id,
            "stage": "performance",
            "baseline": {"results": [{"prompt": prompt, "text": text} for prompt, text in zip(PROMPTS, texts)]},
            "performance": {"tokens_per_second": tokens_per_second, "accept_length": accept_length},
        },
        **extra,
    )


def choices():
    return {"coder": dict(CANDIDATE), "coder-shadow": dict(CANDIDATE)}


def test_a_production_service_with_a_shadow_stays_on_its_release_and_the_shadow_takes_the_candidate():
    held = hold_for_shadows(
        choices(), SERVICES, {"coder": "aaaaaaaaaaaa", "coder-shadow": None}, RELEASES, "bbbbbbbbbbbb"
    )
    assert held["coder"] == {
        "release_id": "aaaaaaaaaaaa",
        "follows": "shadow",
        "overlay": True,
        "candidate_id": "bbbbbbbbbbbb",
        "shadow": "coder-shadow",
        "reason": "stays on aaaaaaaaaaaa until its shadow coder-shadow has run the candidate bbbbbbbbbbbb and was not worse",
    }
    assert held["coder-shadow"] == CANDIDATE


@pytest.mark.parametrize(
    "running, why",
    [
        (None, "runs nothing yet"),
        ("bbbbbbbbbbbb", "runs the candidate already (promoted: idempotent)"),
        ("cccccccccccc", "runs a base release (it was not DDTREE): nothing of the overlay to protect"),
        ("dddddddddddd", "runs a release no longer on the host"),
    ],
)
def test_a_production_service_with_nothing_to_protect_takes_the_candidate_at_once(running, why):
    assert hold_for_shadows(choices(), SERVICES, {"coder": running}, RELEASES, "bbbbbbbbbbbb")["coder"] == CANDIDATE, (
        why
    )


def test_a_pinned_production_service_stays_pinned_and_one_without_a_shadow_follows_the_candidate():
    pinned = dict(
        choices(), coder={"release_id": "aaaaaaaaaaaa", "follows": "pin", "overlay": True, "reason": "pinned"}
    )
    assert (
        hold_for_shadows(pinned, SERVICES, {"coder": "aaaaaaaaaaaa"}, RELEASES, "bbbbbbbbbbbb")["coder"]["follows"]
        == "pin"
    )
    alone = hold_for_shadows(choices(), SERVICES[:1], {"coder": "aaaaaaaaaaaa"}, RELEASES, "bbbbbbbbbbbb")
    assert alone["coder"] == CANDIDATE


def test_identical_outputs_pass_and_one_differing_output_names_its_prompt_and_where():
    production = gate("a", ["2, 3, 5, 7", "def fib(n):"], 100, 3)["baseline"]["results"]
    assert compare_outputs(production, production) == []
    lossy = gate("b", ["2, 3, 5, 7", "def fob(n):"], 100, 3)["baseline"]["results"]
    assert compare_outputs(lossy, production) == [
        "the greedy output for prompt 'Write fib(n).' differs from production's after character 5: production 'def fib(n):', shadow 'def fob(n):'"
    ]
    # A longer (or shorter) output differs too: greedy decoding stops where the target stops.
    longer = gate("b", ["2, 3, 5, 7, 11", "def fib(n):"], 100, 3)["baseline"]["results"]
    assert len(compare_outputs(longer, production)) == 1


def test_an_output_production_did_not_generate_or_none_at_all_is_not_identical():
    shadow = gate("b", ["2, 3, 5, 7", "def fib(n):"], 100, 3)["baseline"]["results"]
    assert compare_outputs(shadow, shadow[:1]) == ["production generated nothing for prompt 'Write fib(n).'"]
    assert compare_outputs([], shadow) == ["the shadow generated no outputs to compare"]


@pytest.mark.parametrize("shadow_tps, problems", [(100.0, 0), (91.0, 0), (90.0, 0), (89.9, 1), (None, 1)])
def test_tokens_per_second_may_be_lower_than_productions_by_max_slowdown_at_most(shadow_tps, problems):
    assert len(compare_speed(shadow_tps, 100.0, 0.1)) == problems
    if problems and shadow_tps:
        assert compare_speed(shadow_tps, 100.0, 0.1) == [
            "tokens/s 89.9 is 10% below production's 100 (max_slowdown 0.1 allows down to 90)"
        ]


def test_acceptance_may_not_be_lower_than_productions():
    assert compare_acceptance(4.2, 4.2) == [] and compare_acceptance(5.0, 4.2) == []
    assert compare_acceptance(4.1, 4.2) == ["acceptance length 4.1 is below production's 4.2"]
    assert compare_acceptance(None, 4.2) == ["the shadow reported no acceptance length; production's is 4.2"]
    assert compare_acceptance(None, None) == []


def test_a_shadow_that_passed_and_is_not_worse_is_promoted_with_its_numbers():
    verdict = shadow_verdict(gate("b", ["x1", "y1"], 95, 4.0), gate("a", ["x1", "y1"], 100, 4.0), 0.1)
    assert verdict["verdict"] == "promoted" and verdict["promote"] is True and verdict["problems"] == []
    assert verdict["shadow"] == {
        "release_id": "b",
        "passed": True,
        "stage": "performance",
        "tokens_per_second": 95.0,
        "accept_length": 4.0,
    }
    assert verdict["production"]["tokens_per_second"] == 100.0 and verdict["outputs_compared"] == 2


def test_a_faster_shadow_that_accepts_more_but_changes_an_output_is_held():
    # A lossy tree walk: accepts any child, so it is fast and accepts much; its outputs are not the target's.
    verdict = shadow_verdict(gate("b", ["x1", "y2"], 300, 7.5), gate("a", ["x1", "y1"], 100, 4.0))
    assert verdict["verdict"] == "held" and verdict["promote"] is False
    assert [problem.split(" differs")[0] for problem in verdict["problems"]] == [
        "the greedy output for prompt 'Write fib(n).'"
    ]


def test_a_shadow_whose_gate_failed_is_held_for_that_reason_alone():
    failed = gate(
        "b", ["x1", "y1"], 100, 4.0, passed=False, failed_stage="degenerate", msg="the chat output is degenerate "
    )
    verdict = shadow_verdict(failed, {})
    assert verdict["problems"] == ["the shadow failed its gate at degenerate: the chat output is degenerate"]
    assert shadow_verdict({}, gate("a", ["x1", "y1"], 100, 4.0))["problems"] == ["the shadow was not gated in this run"]


def test_a_production_service_that_could_not_be_measured_holds_the_candidate():
    dead = {"passed": False, "failed_stage": "health", "msg": "hung"}
    verdict = shadow_verdict(gate("b", ["x1", "y1"], 100, 4.0), dead)
    assert verdict["verdict"] == "held" and verdict["problems"] == [
        "production could not be measured (its gate stopped at health: hung)"
    ]


def test_every_reason_a_shadow_is_worse_is_named():
    verdict = shadow_verdict(gate("b", ["x2", "y1"], 50, 3.0), gate("a", ["x1", "y1"], 100, 4.0), 0.1)
    assert len(verdict["problems"]) == 3
    assert [p.split(" ")[0] for p in verdict["problems"]] == ["the", "tokens/s", "acceptance"]
