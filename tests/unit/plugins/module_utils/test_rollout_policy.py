"""The rollout policy: validation (errors name the value and the fix), Ansible's batch arithmetic, bake verdicts."""

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils.rollout_policy import (
    DEFAULT_POLICY,
    PolicyError,
    bake_checks,
    bake_verdict,
    bake_verdicts,
    batch_sizes,
    max_fail_percentage,
    validate_policy,
)

try:  # the arithmetic must be ansible-core's own: compare with it where it is importable
    from ansible.utils.helpers import pct_to_int
except ImportError:  # pragma: no cover
    pct_to_int = None


def test_the_default_is_todays_rollout():
    policy = validate_policy()
    assert policy == {"batches": [1, "50%"], "bake_time_s": 0, "max_failures_per_batch": 0, "inconclusive": "pause"}
    assert validate_policy({}) == policy
    assert max_fail_percentage(policy) == 0
    assert DEFAULT_POLICY["batches"] == [1, "50%"]


def test_legacy_batches_still_work():
    assert validate_policy(None, legacy_batches=[1, "25%"])["batches"] == [1, "25%"]
    assert validate_policy(None, legacy_batches=2)["batches"] == [2]


def test_normalises_counts_and_percentages():
    policy = validate_policy({"batches": [1, "5 %", "25%", "100%"], "bake_time_s": 300})
    assert policy["batches"] == [1, "5%", "25%", "100%"]
    assert validate_policy({"batches": ["1", "3"]})["batches"] == [1, 3]
    assert validate_policy({"bake_time_s": "300", "max_failures_per_batch": "1"}) == dict(
        DEFAULT_POLICY, bake_time_s=300, max_failures_per_batch=1
    )


@pytest.mark.parametrize(
    "policy, words",
    [
        ("fast", ["ddtree_rollout_policy is 'fast'", "mapping"]),
        ({"bake_time": 300}, ["unknown key(s) bake_time", "bake_time_s"]),
        ({"batches": []}, ["batches is []", "non-empty list"]),
        ({"batches": [1, 0]}, ["batches[1] is 0", "at least one host"]),
        ({"batches": [1, "0%"]}, ["batches[1] is '0%'", "'1%' to '100%'"]),
        ({"batches": [1, "150%"]}, ["batches[1] is '150%'", "'1%' to '100%'"]),
        ({"batches": [1, "2.5%"]}, ["batches[1] is '2.5%'", "whole percentage"]),
        ({"batches": [1, "half"]}, ["batches[1] is 'half'", "count of hosts"]),
        ({"batches": [True]}, ["batches[0] is True"]),
        ({"batches": [1, "25%", "5%"]}, ["batches[2] is '5%', smaller than batches[1] '25%'", "reorder"]),
        ({"batches": [10, 2]}, ["batches[1] is 2, smaller than batches[0] 10"]),
        ({"bake_time_s": -1}, ["bake_time_s is -1", ">= 0"]),
        ({"bake_time_s": "5m"}, ["bake_time_s is '5m'"]),
        ({"bake_time_s": 2.5}, ["bake_time_s is 2.5", "whole seconds"]),
        ({"max_failures_per_batch": -1}, ["max_failures_per_batch is -1", "integer >= 0"]),
        ({"max_failures_per_batch": 1.5}, ["max_failures_per_batch is 1.5"]),
        ({"inconclusive": "continue"}, ["inconclusive is 'continue'", "pause or fail"]),
    ],
)
def test_errors_name_the_value_and_the_fix(policy, words):
    with pytest.raises(PolicyError) as error:
        validate_policy(policy)
    for word in words:
        assert word in str(error.value)


def test_both_spellings_of_the_batches_is_an_error():
    with pytest.raises(PolicyError, match="both ddtree_rollout_batches"):
        validate_policy({"batches": [1]}, legacy_batches=[2])


def test_a_count_may_follow_a_larger_percentage():
    # Kinds compare only among themselves: how many hosts 5% is depends on the fleet.
    assert validate_policy({"batches": [1, "5%", 3]})["batches"] == [1, "5%", 3]


def test_failures_allowed_hand_the_count_to_the_batch_check():
    assert max_fail_percentage(validate_policy({"max_failures_per_batch": 2})) == 100


@pytest.mark.parametrize(
    "batches, hosts, sizes",
    [
        ([1, "50%"], 2, [1, 1]),
        ([1, "50%"], 10, [1, 5, 4]),
        ([1, "5%", "25%", "100%"], 24, [1, 1, 6, 16]),  # 5% of 24 is 1.2: rounded down
        ([1, "5%", "25%", "100%"], 200, [1, 10, 50, 139]),
        (["1%"], 3, [1, 1, 1]),  # never a batch of 0
        ([5], 3, [3]),
        ([1, "50%"], 0, []),
    ],
)
def test_batch_sizes(batches, hosts, sizes):
    assert batch_sizes(batches, hosts) == sizes
    assert sum(sizes) == hosts


@pytest.mark.skipif(pct_to_int is None, reason="ansible-core is not importable")
@pytest.mark.parametrize("percent", ["1%", "5%", "25%", "33%", "50%", "99%", "100%"])
@pytest.mark.parametrize("hosts", [1, 3, 7, 24, 199, 200, 1001])
def test_percentages_round_as_ansible_does(percent, hosts):
    assert batch_sizes([percent], hosts)[0] == min(pct_to_int(percent, hosts), hosts)


def test_bake_checks_one_per_service_and_no_secrets():
    state = {
        "a": {
            "since": "2026-11-30 10:00:00",
            "release_id": "r1",
            "services": [
                {
                    "name": "coder",
                    "unit": "sglang-coder.service",
                    "host": "0.0.0.0",
                    "port": 30000,
                    "served_model_name": "m",
                    "gpus": [0],
                    "api_key": "secret",
                    "flags": ["--x"],
                }
            ],
        },
        "b": {"services": []},
    }
    checks = bake_checks(["a", "b", "c"], state)
    service = {
        "name": "coder",
        "unit": "sglang-coder.service",
        "host": "0.0.0.0",
        "port": 30000,
        "served_model_name": "m",
        "gpus": [0],
        "flags": ["--x"],
    }
    assert checks == [
        {
            "host": "a",
            "since": "2026-11-30 10:00:00",
            "release_id": "r1",
            "service": service,
            # The gate's entry: the plan entry with the journal's start, the release and the host re-checked.
            "gate": dict(service, since="2026-11-30 10:00:00", release_id="r1", bake_host="a"),
        }
    ]
    assert "secret" not in repr(checks)


def test_bake_checks_recheck_the_release_each_service_runs():
    """A pinned service or one on its base release is re-checked on that release, not the host's candidate."""
    state = {
        "a": {
            "since": "t",
            "release_id": "candidate",
            "releases": {"pinned": "p1", "chat": "base1"},
            "services": [{"name": "coder"}, {"name": "pinned"}, {"name": "chat"}],
        }
    }
    assert [(check["service"]["name"], check["release_id"]) for check in bake_checks(["a"], state)] == [
        ("coder", "candidate"),
        ("pinned", "p1"),
        ("chat", "base1"),
    ]


def test_bake_verdicts():
    gate = {"passed": True, "msg": "healthy"}
    assert bake_verdict(gate)["verdict"] == "passed"
    assert bake_verdict({"failed": True, "passed": False, "failure_kind": "child_crashed", "msg": "died"}) == {
        "verdict": "failed",
        "reason": "died",
    }
    assert bake_verdict({"failed": True, "passed": False, "failure_kind": "hung", "msg": "503"})["verdict"] == "failed"
    # Nothing learnt about the service: pause, do not roll back.
    assert bake_verdict({"unreachable": True, "msg": "ssh: connect timed out"})["verdict"] == "inconclusive"
    assert bake_verdict({"failed": True, "timedout": {"period": 90}, "msg": "timed out"})["verdict"] == "inconclusive"
    assert bake_verdict({"failed": True, "msg": "MODULE FAILURE"})["verdict"] == "inconclusive"
    assert (
        bake_verdict({"failed": True, "passed": False, "failure_kind": "journal", "msg": "no journalctl"})["verdict"]
        == "inconclusive"
    )


def test_bake_verdicts_sorts_a_loop_by_verdict():
    results = [
        {"item": {"host": "a", "service": {"name": "coder"}}, "passed": True},
        {
            "item": {"host": "b", "service": {"name": "coder"}},
            "failed": True,
            "passed": False,
            "failure_kind": "killed",
            "msg": "x",
        },
        {"item": {"host": "c", "service": {"name": "chat"}}, "unreachable": True, "msg": "down"},
    ]
    out = bake_verdicts(results)
    assert [entry["host"] for entry in out["passed"]] == ["a"]
    assert [(entry["host"], entry["service"]) for entry in out["failed"]] == [("b", "coder")]
    assert [entry["host"] for entry in out["inconclusive"]] == ["c"]


def test_bake_outcome_stops_on_a_failure_and_pauses_only_on_inconclusive_re_checks_under_pause():
    from ansible_collections.ddtree.sglang.plugins.module_utils.rollout_policy import bake_outcome

    failed = [{"host": "ct200", "service": "coder", "reason": "chat: no answer"}]
    unsure = [{"host": "ct129", "service": "chat", "reason": "unreachable"}]
    assert bake_outcome({"failed": [], "inconclusive": []}, "pause") == {"action": "continue", "msg": ""}
    stop = bake_outcome({"failed": failed, "inconclusive": unsure}, "pause")
    assert stop["action"] == "stop" and "failed for ct200 coder (chat: no answer)" in stop["msg"]
    assert bake_outcome({"failed": [], "inconclusive": unsure}, "fail")["action"] == "stop"
    pause = bake_outcome({"failed": [], "inconclusive": unsure}, "pause")
    assert pause["action"] == "pause" and pause["msg"].startswith(
        "PAUSED: the bake's re-check was inconclusive for ct129 chat"
    )
