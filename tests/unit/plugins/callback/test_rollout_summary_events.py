"""What the rollout_summary callback records from a task's result: a production service measured for its
shadow is not that service's gate; the shadow's comparison is its own event."""

from types import SimpleNamespace

from ansible_collections.ddtree.sglang.plugins.callback.rollout_summary import CallbackModule


def result(action, event=None, **data):
    task = SimpleNamespace(resolved_action=action, action=action, delegate_to=None, get_name=lambda: "task",
                           get_vars=lambda: {"ddtree_rollout_event": event} if event else {})
    return SimpleNamespace(_task=task, _result=dict(data), _host=SimpleNamespace(get_name=lambda: "ct200"))


def test_a_measurement_for_a_shadow_is_not_recorded_as_the_services_gate():
    callback = CallbackModule()
    callback._record(result("ddtree.sglang.sglang_health", "measure", service="coder", passed=True))
    assert callback.events == []
    callback._record(result("ddtree.sglang.sglang_health", None, service="coder", passed=True))
    callback._record(result("ddtree.sglang.service_shadow_compare", None, service="coder", verdict="held"))
    assert [(event["kind"], event["service"]) for event in callback.events] == [("gate", "coder"), ("shadow", "coder")]
