"""service_actions: what the sglang_service role restarts, gates, quick-checks, rolls back and promotes."""

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils.service_actions import (
    RELEASE_SWITCHED,
    UNCHANGED,
    rollback_gate,
    rollback_record,
    service_actions,
)


def entry(name, **extra):
    return dict(
        {"name": name, "unit": "sglang-%s.service" % name, "gpus": [0], "gate": {"start_timeout": 900}}, **extra
    )


CODER, CHAT = entry("coder"), entry("chat")
RELEASES = {"coder": {"release_id": "new", "follows": "candidate"}, "chat": {"release_id": "base", "follows": "base"}}
PASSED = {"action": "none", "reason": "passed", "unit_state": {"active": True}}


def decide(services=(CODER, CHAT), switched=(), changed=None, recorded=None, **kwargs):
    recorded = {"coder": PASSED, "chat": PASSED} if recorded is None else recorded
    return service_actions(list(services), RELEASES, list(switched), changed or {}, recorded, **kwargs)


def names(entries):
    return [item["name"] for item in entries]


def test_nothing_changed_restarts_nothing_and_only_asks_for_health():
    actions = decide()
    assert names(actions["restart"]) == [] and names(actions["gate"]) == []
    assert names(actions["start"]) == names(actions["quick_check"]) == ["coder", "chat"]
    assert actions["services"]["chat"]["reasons"] == [UNCHANGED]


@pytest.mark.parametrize(
    "changed, reason",
    [
        ({"units": ["coder"]}, "unit changed"),
        ({"environments": [{"changed": True, "item": CODER}, {"changed": False, "item": CHAT}]}, "environment changed"),
        ({"api_keys": [{"changed": True, "item": CODER}]}, "API key changed"),
        # service_files' loop results: each names the files it wrote; a new state directory restarts nothing.
        ({"files": [{"changed": True, "changes": ["unit"], "item": CODER}]}, "unit changed"),
        (
            {"files": [{"changed": True, "changes": ["environment"], "item": CODER}, {"changed": False, "item": CHAT}]},
            "environment changed",
        ),
        ({"files": [{"changed": True, "changes": ["api_key"], "item": CODER}]}, "API key changed"),
    ],
)
def test_a_service_whose_unit_environment_or_key_changed_restarts_and_is_gated(changed, reason):
    actions = decide(changed=changed)
    assert names(actions["restart"]) == names(actions["gate"]) == ["coder"]
    assert names(actions["quick_check"]) == ["chat"]
    assert actions["services"]["coder"]["reasons"] == [reason]
    # The role's one systemd task restarts what changed and only starts the others.
    assert [(item["name"], item["state"]) for item in actions["start"]] == [("coder", "restarted"), ("chat", "started")]
    # Each gated entry names the release it gates.
    assert actions["gate"][0]["release_id"] == "new"


def test_each_file_service_files_changed_is_a_reason_and_a_new_state_directory_is_none():
    files = [
        {"changed": True, "changes": ["environment", "api_key", "unit"], "item": CODER},
        {"changed": True, "changes": ["state_dir"], "item": CHAT},
    ]
    actions = decide(changed={"files": files})
    assert actions["services"]["coder"]["reasons"] == ["unit changed", "environment changed", "API key changed"]
    assert names(actions["restart"]) == ["coder"] and actions["services"]["chat"]["reasons"] == [UNCHANGED]


def test_a_changed_launcher_restarts_every_service():
    actions = decide(changed={"launcher": True})
    assert names(actions["restart"]) == ["coder", "chat"]


def test_a_switched_link_restarts_from_the_loop_results():
    links = [{"changed": True, "item": CODER}, {"changed": False, "item": CHAT}]
    actions = service_actions([CODER, CHAT], RELEASES, links, {}, {"coder": PASSED, "chat": PASSED})
    assert names(actions["restart"]) == ["coder"]
    assert actions["services"]["coder"]["reasons"] == [RELEASE_SWITCHED]


def test_a_service_that_is_not_running_is_started_and_gated_not_restarted():
    actions = decide(recorded={"coder": dict(PASSED, unit_state={"active": False}), "chat": PASSED})
    assert names(actions["restart"]) == [] and names(actions["gate"]) == ["coder"]


def test_a_release_without_a_verdict_is_restarted_or_gated_as_it_runs():
    recorded = {
        "coder": {"action": "restart", "reason": "interrupted", "unit_state": {"active": True}},
        "chat": {"action": "gate", "reason": "interrupted", "unit_state": {"active": True}},
    }
    actions = decide(recorded=recorded)
    assert names(actions["restart"]) == ["coder"]
    assert names(actions["gate"]) == ["coder", "chat"] and actions["quick_check"] == []


def test_a_recorded_failed_verdict_rolls_back_without_starting_the_failed_release():
    failed = {
        "action": "rollback",
        "reason": "failed_verdict",
        "release_id": "bad",
        "verdict": {"stage": "chat", "failure_kind": "chat", "recorded_at": "T", "msg": "no answer"},
    }
    actions = decide(recorded={"coder": failed, "chat": PASSED}, changed={"launcher": True})
    assert names(actions["restart"]) == ["chat"] and names(actions["start"]) == ["chat"]
    assert "coder" not in names(actions["gate"]) + names(actions["quick_check"])
    assert actions["services"]["coder"]["rollback"] is True
    after = decide(recorded={"coder": failed, "chat": PASSED}, gate_results=[])
    assert [
        (r["item"]["name"], r["release_id"], r["failed_stage"], r["recorded_verdict"]) for r in after["rollback"]
    ] == [("coder", "bad", "chat", True)]
    assert "coder (release bad, chat: its gate failed at T" in after["msg"]


def test_a_release_switched_to_in_this_run_is_gated_afresh_whatever_an_earlier_gate_said():
    failed = {"action": "rollback", "reason": "failed_verdict"}
    actions = decide(recorded={"coder": failed, "chat": PASSED}, switched=["coder"])
    assert names(actions["restart"]) == ["coder"] and actions["services"]["coder"]["rollback"] is False


def test_a_service_restarted_by_its_tuning_is_gated():
    actions = decide(window_restarted=["chat"])
    assert names(actions["gate"]) == ["chat"] and names(actions["restart"]) == []


def test_check_mode_starts_only_installed_units_and_gates_nothing():
    actions = decide(changed={"launcher": True}, installed=["chat"], check_mode=True)
    assert names(actions["restart"]) == names(actions["start"]) == ["chat"]
    assert actions["gate"] == [] and actions["quick_check"] == []
    # What would be gated is still said.
    assert actions["services"]["chat"]["gate"] is True


def test_failed_gates_are_rolled_back_in_order_and_the_host_fails():
    gates = [
        {"item": CODER, "passed": False, "failed_stage": "baseline", "msg": "differs"},
        {"item": CHAT, "passed": True},
    ]
    actions = decide(gate_results=gates, host="ct200")
    assert [r["item"]["name"] for r in actions["rollback"]] == ["coder"]
    assert actions["msg"].startswith("ct200: the health gate failed for coder (release new, baseline: differs)")
    assert decide(gate_results=[{"item": CODER, "passed": True}])["rollback"] == []


SHADOW = entry("coder-shadow", shadow_of="coder")
SHADOW_RELEASES = {
    "coder": {"release_id": "old", "follows": "shadow", "shadow": "coder-shadow"},
    "coder-shadow": {"release_id": "new", "follows": "candidate"},
}


def shadow_actions(verdict, shadow_passed=True):
    return service_actions(
        [CODER, SHADOW],
        SHADOW_RELEASES,
        [],
        {},
        {},
        gate_results=[{"item": SHADOW, "passed": shadow_passed, "msg": "x"}],
        shadow_verdicts={"coder": verdict},
    )


def test_a_production_service_waits_for_its_shadow():
    actions = service_actions([CODER, SHADOW], SHADOW_RELEASES, [], {}, {})
    assert [(item["name"], item["shadow"], item["release_id"]) for item in actions["compare_shadow"]] == [
        ("coder", "coder-shadow", "old")
    ]


def test_after_the_gates_each_comparison_has_its_shadows_gate_and_slowdown():
    shadow = dict(SHADOW, shadow_max_slowdown=0.05)
    gate = {"item": shadow, "passed": True, "msg": "healthy"}
    actions = service_actions([CODER, shadow], SHADOW_RELEASES, [], {}, {}, gate_results=[gate])
    [comparison] = actions["compare_shadow"]
    assert (comparison["shadow_gate"], comparison["shadow_max_slowdown"]) == (gate, 0.05)
    # A shadow that was not gated in this run has no gate to compare with: production is not measured.
    actions = service_actions([CODER, SHADOW], SHADOW_RELEASES, [], {}, {}, gate_results=[])
    assert actions["compare_shadow"][0]["shadow_gate"] == {}
    assert actions["compare_shadow"][0]["shadow_max_slowdown"] is None


def test_a_shadow_that_passed_and_was_not_worse_promotes_its_production_service_to_the_candidate():
    actions = shadow_actions(
        {"promote": True, "shadow": {"release_id": "new", "passed": True}, "shadow_service": "coder-shadow"}
    )
    assert [(item["name"], item["release_id"]) for item in actions["promote"]] == [("coder", "new")]
    assert actions["promote"][0]["state"] == "restarted"  # it runs the candidate only once restarted
    assert actions["rollback"] == []


def test_a_held_candidate_rolls_the_shadow_back_and_production_keeps_its_release():
    verdict = {
        "promote": False,
        "shadow": {"release_id": "new", "passed": True},
        "shadow_service": "coder-shadow",
        "problems": ["slower"],
    }
    actions = shadow_actions(verdict)
    assert actions["promote"] == []
    assert [
        (r["item"]["name"], r["failed_stage"], r["failure_kind"], r["release_id"]) for r in actions["rollback"]
    ] == [("coder-shadow", "shadow", "shadow_worse", "new")]
    assert actions["rollback"][0]["msg"] == "worse than coder, which stays on its release: slower"


def test_a_shadow_whose_own_gate_failed_is_rolled_back_once():
    verdict = {"promote": False, "shadow": {"release_id": "new", "passed": False}, "shadow_service": "coder-shadow"}
    actions = shadow_actions(verdict, shadow_passed=False)
    assert [r["item"]["name"] for r in actions["rollback"]] == ["coder-shadow"]


def test_a_host_that_rolls_back_promotes_nothing():
    verdict = {"promote": True, "shadow": {"release_id": "new", "passed": True}, "shadow_service": "coder-shadow"}
    actions = service_actions(
        [CODER, SHADOW, CHAT],
        dict(SHADOW_RELEASES, **RELEASES),
        [],
        {},
        {},
        gate_results=[{"item": SHADOW, "passed": True}, {"item": CHAT, "passed": False, "msg": "x"}],
        shadow_verdicts={"coder": verdict},
    )
    assert actions["promote"] == [] and names([r["item"] for r in actions["rollback"]]) == ["chat"]


def test_the_rollback_record_keeps_the_evidence():
    failed = {
        "item": CODER,
        "failed_stage": "unit_watch",
        "msg": "crashed",
        "journal_excerpt": ["l%d" % i for i in range(50)],
    }
    record = rollback_record(
        failed, {"release_id": "old", "before": {"release_id": "new"}}, {"passed": False, "msg": "also"}, "T"
    )
    assert record == {
        "time": "T",
        "event": "rollback",
        "failed_release_id": "new",
        "failed_stage": "unit_watch",
        "msg": "crashed",
        "journal": ["l%d" % i for i in range(10, 50)],
        "rolled_back_to_release_id": "old",
        "previous_gate": "failed: also",
    }
    assert rollback_record({}, {}, {"passed": True}, "T")["previous_gate"] == "passed"


def test_the_rollback_record_takes_its_services_gate_among_the_rollbacks():
    gates = [{"item": CHAT, "passed": False, "msg": "chat's"}, {"item": CODER, "passed": True}]
    assert rollback_gate({"item": CODER, "msg": "crashed"}, gates) == {"item": CODER, "passed": True}
    assert rollback_gate({"item": entry("other")}, gates) is None
