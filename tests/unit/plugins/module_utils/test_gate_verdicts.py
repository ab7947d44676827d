"""The gate's verdicts and what a run does about a service's current release (docs/health-gate.md, Verdicts)."""

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils.gate_verdicts import (
    fallback_after_switch,
    gate_action,
    started_after,
    unit_facts,
    verdict_for,
    verdict_record,
    verdicts_add,
)

PASSED = {"verdict": "passed", "recorded_at": "2026-11-30T10:00:00Z"}
FAILED = {"verdict": "failed", "recorded_at": "2026-11-30T10:05:00Z", "stage": "baseline"}


def document(**verdicts):
    return {"format": 1, "verdicts": verdicts}


@pytest.mark.parametrize(
    "verdicts, active, after, restarts, expected",
    [
        # passed: nothing to do (a restart in this run is gated anyway)
        ({"new": PASSED}, True, True, 0, ("none", "passed")),
        # the incident: current switched, the run died before the verdict, the process is the new release
        ({"old": PASSED}, True, True, 0, ("gate", "interrupted")),
        # died between the switch and the restart: the process is still the old release
        ({"old": PASSED}, True, False, 0, ("restart", "interrupted")),
        # died during the rollback after the stop: the unit is down
        ({"old": PASSED}, False, False, 0, ("restart", "interrupted")),
        # systemd restarted it by itself since: the gate's unit watch would read a crash, so restart
        ({"old": PASSED}, True, True, 2, ("restart", "interrupted")),
        # a host from before verdicts: gated once, as it runs
        ({}, True, True, 0, ("gate", "no_verdicts_yet")),
        # the gate failed and the run died before the rollback: roll back, without starting it again
        ({"old": PASSED, "new": FAILED}, True, True, 0, ("rollback", "failed_verdict")),
        # failed, and previous failed too: nothing good to go back to; gate again (the host fails loudly)
        ({"old": FAILED, "new": FAILED}, True, True, 0, ("restart", "failed_verdict")),
    ],
)
def test_gate_action(verdicts, active, after, restarts, expected):
    decision = gate_action("new", "old", document(**verdicts), active, after, restarts)
    assert (decision["action"], decision["reason"]) == expected
    assert decision["verdict"] == verdicts.get("new")


def test_no_current_link_asks_for_nothing():
    assert gate_action(None, None, None, False, False)["action"] == "none"


def test_a_failed_release_with_nothing_to_go_back_to_is_gated_again():
    assert gate_action("new", None, document(new=FAILED), True, True)["action"] == "restart"


def test_started_after_needs_a_later_second():
    assert started_after(1001.0, 1000.4) is True
    assert started_after(1000.0, 1000.4) is False  # the same second, floored: order unknown
    assert started_after(None, 1000.0) is False and started_after(1000.0, None) is False


def test_unit_facts_from_systemctl_show_unix_timestamps():
    facts = unit_facts({"ActiveState": "active", "NRestarts": "0", "ExecMainStartTimestamp": "@1732960000"})
    assert facts == {"active": True, "restarts": 0, "process_start": 1732960000.0}
    assert unit_facts({"ActiveState": "inactive", "ExecMainStartTimestamp": ""}) == {
        "active": False,
        "restarts": 0,
        "process_start": None,
    }


def test_verdict_record_keeps_the_measurements_and_the_failure():
    result = {
        "failed_stage": "baseline",
        "stage": "baseline",
        "failure_kind": "baseline_mismatch",
        "msg": "x" * 900,
        "startup": {"time_to_port_s": 3.1},
        "baseline": {"status": "failed", "results": [{"status": "match"}, {"status": "mismatch"}]},
        "performance": {},
        "timings": {"total": 9.0},
    }
    record = verdict_record(False, result, "2026-11-30T10:00:00Z")
    assert (
        record["verdict"] == "failed"
        and record["stage"] == "baseline"
        and record["failure_kind"] == "baseline_mismatch"
    )
    assert len(record["msg"]) == 500 and record["measurements"]["baseline_mismatches"] == 1
    assert record["measurements"]["time_to_port_s"] == 3.1 and record["measurements"]["total_s"] == 9.0
    passed = verdict_record(True, {"stage": "performance", "performance": {"tokens_per_second": 40.0}}, "t")
    assert (
        passed["verdict"] == "passed"
        and passed["failure_kind"] is None
        and passed["measurements"]["tokens_per_second"] == 40.0
    )


def test_verdicts_add_replaces_a_release_and_keeps_the_newest():
    doc = None
    for number in range(5):
        doc = verdicts_add(
            doc, "r%d" % number, {"verdict": "passed", "recorded_at": "2026-11-30T10:0%d:00Z" % number}, keep=3
        )
    assert list(doc["verdicts"]) == ["r2", "r3", "r4"]
    doc = verdicts_add(doc, "r2", dict(FAILED, recorded_at="2026-11-30T11:00:00Z"), keep=3)
    assert verdict_for(doc, "r2")["verdict"] == "failed" and list(doc["verdicts"])[-1] == "r2"
    assert verdict_for(doc, None) is None
    with pytest.raises(ValueError, match="release_id is empty"):
        verdicts_add(doc, "", PASSED)


def test_previous_only_becomes_a_release_that_passed_its_gate():
    verdicts = document(a=PASSED, x=FAILED)
    assert fallback_after_switch("a", None, "b", verdicts) == "a"
    # current was left failed (or unverified) by an interrupted rollout: keep the fallback before it
    assert fallback_after_switch("x", "a", "b", verdicts) == "a"
    assert fallback_after_switch("y", "a", "b", verdicts) == "a"
    # the same release again: links unchanged
    assert fallback_after_switch("b", "a", "b", verdicts) == "a"
    # a host from before verdicts: as always
    assert fallback_after_switch("y", "a", "b", None) == "y"


def test_outputs_recorded_as_the_first_baseline_are_not_counted_as_mismatches():
    # A blank host's first release: every prompt "new". The report said "baseline_mismatches 3" for it.
    result = {
        "stage": "performance",
        "baseline": {
            "status": "recorded",
            "reference": "none",
            "results": [{"status": "new"}, {"status": "new"}, {"status": "new"}],
        },
    }
    measured = verdict_record(True, result, "t")["measurements"]
    assert measured["baseline_mismatches"] == 0 and measured["baseline"] == "recorded"
    assert measured["baseline_reference"] == "none"
