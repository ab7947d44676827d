"""fleet_baselines (module) adds a host's new baselines to the controller's file; the lookup reads it back."""

import json

import pytest
from conftest import run_module

from ansible_collections.ddtree.sglang.plugins.module_utils.fleet_baselines import read_fleet
from ansible_collections.ddtree.sglang.plugins.modules import fleet_baselines

KEY = "qwen3-coder | DFLASH | tp 2 | sglang 0.5.23"
PROMPT = "List the first ten prime numbers, separated by commas."


def new_baselines(text, release_id="r1"):
    return {
        "format": 2,
        "baselines": {
            KEY: {
                "64": {
                    PROMPT: {
                        "text": text,
                        "completion_tokens": 30,
                        "release_id": release_id,
                        "recorded_at": "2026-12-04T10:00:00Z",
                    }
                }
            }
        },
    }


def test_the_first_host_records_and_a_later_one_never_replaces_it(tmp_path, capsys):
    path = tmp_path / "fleet" / "fleet.json"
    code, result = run_module(
        fleet_baselines,
        {"path": str(path), "baselines": new_baselines("2, 3, 5"), "host": "ct200", "_ansible_diff": True},
        capsys,
    )
    assert code == 0 and result["changed"] and result["added"] == [{"key": KEY, "max_tokens": 64, "prompt": PROMPT}]
    assert result["diff"]["after"] == "%s | max_tokens 64 | %s\n" % (KEY, PROMPT)
    entry = json.loads(path.read_text())["baselines"][KEY]["64"][PROMPT]
    assert entry["host"] == "ct200" and entry["text"] == "2, 3, 5" and entry["release_id"] == "r1"
    code, result = run_module(
        fleet_baselines, {"path": str(path), "baselines": new_baselines("2, 3, 4", "r2"), "host": "ct201"}, capsys
    )
    assert code == 0 and result["changed"] is False and result["added"] == []
    assert json.loads(path.read_text())["baselines"][KEY]["64"][PROMPT]["host"] == "ct200"


def test_check_mode_says_what_it_would_add_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "fleet" / "fleet.json"
    code, result = run_module(
        fleet_baselines,
        {"path": str(path), "baselines": new_baselines("2, 3, 5"), "host": "ct200", "_ansible_check_mode": True},
        capsys,
    )
    assert code == 0 and result["changed"] and len(result["added"]) == 1
    assert not path.parent.exists()


def test_a_broken_fleet_file_is_named_with_what_to_do(tmp_path, capsys):
    path = tmp_path / "fleet.json"
    path.write_text('{"format": 2, "baselines": {"k": {"64": {"p": "text"}}}}')
    code, result = run_module(
        fleet_baselines, {"path": str(path), "baselines": new_baselines("x"), "host": "ct200"}, capsys
    )
    assert code == 1 and str(path) in result["msg"] and "the entries of key 'k' (max_tokens 64)" in result["msg"]
    assert "move the file away" in result["msg"]


def test_the_lookups_reading_takes_a_missing_file_as_empty_and_names_one_it_cannot_read(tmp_path):
    # The lookup ddtree.sglang.fleet_baselines is this function's glue.
    assert read_fleet(str(tmp_path / "none.json")) == {"format": 2, "baselines": {}}
    (tmp_path / "fleet.json").write_text(json.dumps(new_baselines("2, 3, 5")))
    assert read_fleet(str(tmp_path / "fleet.json"))["baselines"][KEY]["64"][PROMPT]["text"] == "2, 3, 5"
    (tmp_path / "fleet.json").write_text("{")
    with pytest.raises(
        ValueError, match="cannot read the fleet's baselines %s: .*move it away" % (tmp_path / "fleet.json")
    ):
        read_fleet(str(tmp_path / "fleet.json"))


def test_from_a_gate_loop_only_the_gates_that_ran_and_passed_add(tmp_path, capsys):
    path = tmp_path / "fleet.json"
    gates = [
        {"unreachable": True, "msg": "no answer"},  # a host that could not be reached: no `passed`
        {"passed": False, "baseline": {"new_baselines": new_baselines("lossy")}},
        {"passed": True, "baseline": {}},
        {"passed": True, "baseline": {"new_baselines": new_baselines("2, 3, 5")}},
    ]
    code, result = run_module(fleet_baselines, {"path": str(path), "gate_results": gates, "host": "ct200"}, capsys)
    assert code == 0 and result["changed"] and len(result["added"]) == 1
    assert read_fleet(str(path))["baselines"][KEY]["64"][PROMPT]["text"] == "2, 3, 5"
    code, result = run_module(fleet_baselines, {"path": str(path), "gate_results": gates[:3], "host": "ct200"}, capsys)
    assert code == 0 and result["changed"] is False and result["added"] == []
