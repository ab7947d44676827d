"""monitoring_targets through main(): writes the targets and the gate's records once, then changes nothing;
check mode says what would change and writes nothing; diff mode shows both files."""

import json

from conftest import run_module

from ansible_collections.ddtree.sglang.plugins.modules import monitoring_targets

CODER = {"name": "coder", "port": 30000, "speculative": {"algorithm": "DDTREE"}}
GATE = [
    {
        "item": "ct200",
        "services": {
            "coder": {"release_id": "r1", "verdict": {"verdict": "passed", "measurements": {"tokens_per_second": 10}}}
        },
    }
]


def args(tmp_path, **more):
    return dict(
        hosts={"ct200": [CODER]},
        gate_status=GATE,
        targets_file=str(tmp_path / "sglang.json"),
        records_file=str(tmp_path / "gate-records.rules.yml"),
        **more,
    )


def test_writes_once_then_changes_nothing(tmp_path, capsys):
    code, result = run_module(monitoring_targets, args(tmp_path), capsys)
    assert code == 0 and result["changed"] and len(result["changed_files"]) == 2
    targets = json.loads((tmp_path / "sglang.json").read_text())
    assert targets[0]["labels"] == {"host": "ct200", "service": "coder", "algorithm": "DDTREE", "release_id": "r1"}
    records = json.loads((tmp_path / "gate-records.rules.yml").read_text())["groups"][0]["rules"]
    assert {"ddtree:throughput_floor_tokens_per_second", "ddtree:spec_accept_length_floor"} <= {
        r["record"] for r in records
    }
    code, result = run_module(monitoring_targets, args(tmp_path), capsys)
    assert code == 0 and not result["changed"] and result["changed_files"] == []


def test_check_mode_writes_nothing_and_diff_shows_the_change(tmp_path, capsys):
    code, result = run_module(monitoring_targets, args(tmp_path, _ansible_check_mode=True, _ansible_diff=True), capsys)
    assert code == 0 and result["changed"] and not (tmp_path / "sglang.json").exists()
    assert [entry["after_header"] for entry in result["diff"]] == [
        str(tmp_path / "sglang.json"),
        str(tmp_path / "gate-records.rules.yml"),
    ]
    assert '"release_id": "r1"' in result["diff"][0]["after"]


def test_a_bad_margin_fails_naming_it(tmp_path, capsys):
    code, result = run_module(monitoring_targets, args(tmp_path, throughput_margin=1.5), capsys)
    assert code == 1 and "throughput_margin must be in [0, 1), got 1.5" in result["msg"]
