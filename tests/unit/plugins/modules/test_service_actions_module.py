"""ddtree.sglang.service_actions as the role calls it: registered loop results in, the lists the role loops over out."""

from conftest import run_module

from ansible_collections.ddtree.sglang.plugins.modules import service_actions

CODER = {"name": "coder", "unit": "sglang-coder.service", "gpus": [0], "gate": {"start_timeout": 900}}
CHAT = {"name": "chat", "unit": "sglang-chat.service", "gpus": [1], "gate": {"start_timeout": 900}}
RELEASES = {"coder": {"release_id": "new", "follows": "candidate"}, "chat": {"release_id": "base", "follows": "base"}}
PASSED = {"action": "none", "reason": "passed", "unit_state": {"active": True}}


def args(tmp_path, **extra):
    return dict(
        {
            "services": [CODER, CHAT],
            "releases": RELEASES,
            "links": [{"changed": True, "item": CODER}, {"changed": False, "item": CHAT}],
            "changed": {
                "units": [],
                "environments": [{"changed": False, "item": CHAT}],
                "api_keys": [],
                "launcher": False,
            },
            "recorded": {"coder": PASSED, "chat": PASSED},
            "units_dir": str(tmp_path),
            "host": "ct200",
        },
        **extra,
    )


def test_the_role_gets_the_lists_it_loops_over(tmp_path, capsys):
    code, result = run_module(service_actions, args(tmp_path), capsys)
    assert code == 0 and result["changed"] is False
    assert [entry["name"] for entry in result["restart"]] == ["coder"]
    assert [(entry["name"], entry["release_id"]) for entry in result["gate"]] == [("coder", "new")]
    assert [entry["name"] for entry in result["quick_check"]] == ["chat"]
    assert result["services"]["coder"]["reasons"] == ["release switched"]
    assert result["rollback"] == [] and result["promote"] == [] and result["msg"] == ""


def test_check_mode_restarts_only_installed_units_and_gates_nothing(tmp_path, capsys):
    (tmp_path / "sglang-chat.service").write_text("[Unit]\n")
    code, result = run_module(
        service_actions,
        dict(args(tmp_path, changed={"launcher": True}), _ansible_check_mode=True),
        capsys,
    )
    assert code == 0
    assert [entry["name"] for entry in result["restart"]] == ["chat"]
    assert result["gate"] == [] and result["quick_check"] == []


def test_after_the_gates_a_failed_gate_is_rolled_back_and_fails_the_host(tmp_path, capsys):
    gates = [{"item": dict(CODER, release_id="new"), "passed": False, "failed_stage": "chat", "msg": "no answer"}]
    code, result = run_module(service_actions, args(tmp_path, gate_results=gates), capsys)
    assert code == 0
    assert [failed["item"]["name"] for failed in result["rollback"]] == ["coder"]
    assert result["msg"].startswith("ct200: the health gate failed for coder (release new, chat: no answer)")
