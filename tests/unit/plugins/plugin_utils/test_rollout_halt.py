"""ddtree.sglang.rollout_halt: the result a bake's stop or pause fails with, which the rollout report reads."""

import pytest

from ansible_collections.ddtree.sglang.plugins.plugin_utils.rollout_halt import halt_result


@pytest.mark.parametrize("action", ["stop", "pause"])
def test_a_stop_or_a_pause_fails_and_names_itself_for_the_report(action):
    result = halt_result(action, "coder on ct200: inconclusive")
    assert result == {"failed": True, "msg": "coder on ct200: inconclusive", "rollout_event": action}


def test_a_rollout_that_goes_on_changes_nothing_and_does_not_fail():
    assert halt_result("continue", "every re-check passed") == {"changed": False}


def test_a_halt_without_a_message_still_says_why():
    assert halt_result("pause", "")["msg"] == "the rollout's bake says: pause"
