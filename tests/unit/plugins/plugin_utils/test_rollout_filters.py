"""The rollout filters (plugins/filter/rollout.py): the play keywords a policy sets, text policies (AWX
surveys), the bake's checks.

Here, with the controller-side plugins' tests, not in a tests/unit/plugins/filter/ that pytest would
collect before tests/unit/plugins/modules/: ansible.errors, once imported, takes `warnings` out of the
module results those tests read (measured: test_release_modules failed after it).
"""

import importlib

import pytest


@pytest.fixture(scope="module")
def rollout():
    # Imported when the tests run, not when pytest collects them: ansible.errors imported that early took
    # `warnings` out of the module results that tests/unit/plugins/modules read.
    return importlib.import_module("ansible_collections.ddtree.sglang.plugins.filter.rollout")


def test_the_default_sets_todays_play_keywords(rollout):
    policy = rollout.rollout_policy(None)
    assert (policy["serial"], policy["max_fail_percentage"], policy["bake_time_s"]) == ([1, "50%"], 0, 0)
    assert rollout.rollout_policy(None, [1, "25%"])["serial"] == [1, "25%"]


def test_a_survey_textarea_is_read_as_yaml(rollout):
    from ansible.errors import AnsibleFilterError

    policy = rollout.rollout_policy("{batches: [1, '5%', '25%', '100%'], bake_time_s: '300'}")
    assert policy["serial"] == [1, "5%", "25%", "100%"] and policy["bake_time_s"] == 300
    assert rollout.rollout_policy("")["serial"] == [1, "50%"]
    with pytest.raises(AnsibleFilterError, match="not YAML"):
        rollout.rollout_policy("{batches: [1,")
    with pytest.raises(AnsibleFilterError, match="batches\\[0\\] is 0"):
        rollout.rollout_policy('{"batches": [0]}')


def test_bake_checks_read_the_roles_facts(rollout):
    hostvars = {
        "a": {
            "sglang_service_plan": {"services": [{"name": "coder", "port": 30000}]},
            "sglang_service_since": {"stdout": "2026-11-30 10:00:00"},
            "sglang_service_release": {"release_id": "r1"},
        },
        "b": {},
    }
    [check] = rollout.rollout_bake_checks(["a", "b"], hostvars)
    assert {key: check[key] for key in ("host", "since", "release_id", "service")} == {
        "host": "a",
        "since": "2026-11-30 10:00:00",
        "release_id": "r1",
        "service": {"name": "coder", "port": 30000},
    }


def test_bake_verdicts_wants_the_loop_results(rollout):
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="a list"):
        rollout.rollout_bake_verdicts({"results": []})
    assert set(rollout.FilterModule().filters()) == {"rollout_policy", "rollout_bake_verdicts", "rollout_bake_checks"}
