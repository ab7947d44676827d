"""service_autotune through main(): says what to measure, decides once per tuning key, writes the state
whole, and its choice is what service_plan runs."""

import json

from conftest import run_module
from service_samples import tuned_coder

from ansible_collections.ddtree.sglang.plugins.modules import service_autotune, service_plan

CODER = tuned_coder()


def measure(dflash=(100.0, 1000.0), b4=(110.0, 1100.0), b8=(105.0, 1050.0)):
    rows = []
    for concurrency, index in ((1, 0), (16, 1)):
        # With the evidence autotune_measure.measure_setting adds (requests, completion_tokens, seconds).
        rows.append(
            {
                "algorithm": "DFLASH",
                "concurrency": concurrency,
                "tokens_per_second": dflash[index],
                "requests": 8,
                "completion_tokens": 2048,
                "seconds": 2048 / dflash[index],
            }
        )
        rows.append(
            {"algorithm": "DDTREE", "budget": 4, "top_k": 4, "concurrency": concurrency, "tokens_per_second": b4[index]}
        )
        rows.append(
            {"algorithm": "DDTREE", "budget": 8, "top_k": 4, "concurrency": concurrency, "tokens_per_second": b8[index]}
        )
    return rows


def args(tmp_path, **extra):
    return dict(
        {"service": CODER, "release_id": "r1", "state_file": str(tmp_path / "coder" / "autotune.json")}, **extra
    )


def test_first_it_says_what_to_measure_then_it_decides_and_records(tmp_path, capsys):
    state = tmp_path / "coder" / "autotune.json"
    code, result = run_module(service_autotune, args(tmp_path), capsys)
    assert code == 0 and result["needs_tuning"] is True and result["changed"] is False and result["choice"] is None
    assert [(m["algorithm"], m["budget"], m["concurrency"]) for m in result["grid"]] == [
        ("DFLASH", None, 1),
        ("DFLASH", None, 16),
        ("DDTREE", 4, 1),
        ("DDTREE", 4, 16),
        ("DDTREE", 8, 1),
        ("DDTREE", 8, 16),
    ]
    assert not state.exists()
    code, result = run_module(service_autotune, args(tmp_path, measurements=measure()), capsys)
    assert code == 0 and result["changed"] is True and result["tuned"] is True
    # budget 4 is +10% at both loads, budget 8 +5%: budget 4 (the fastest at every load, so no schedule).
    choice = result["choice"]
    assert (choice["algorithm"], choice["budget"], choice["top_k"], choice["speed_floor"]) == ("DDTREE", 4, 4, 88.0)
    recorded = json.loads(state.read_text())
    assert recorded["current"]["choice"] == choice and len(recorded["current"]["measurements"]) == 6
    assert recorded["current"]["measurements"][0]["requests"] == 8
    assert recorded["current"]["key"] == result["key"] and recorded["current"]["release_id"] == "r1"
    # The choice is what the plan runs, with the tuned floor for the gate.
    code, plan = run_module(
        service_plan, {"services": [CODER], "gpu_indices": [0, 1], "tuned": {"coder": choice}}, capsys
    )
    assert code == 0
    flags = plan["services"][0]["flags"]
    assert flags[flags.index("--speculative-ddtree-budget") + 1] == "4" and plan["services"][0]["gate"] == {
        "min_tokens_per_second": 88.0
    }
    assert plan["services"][0]["tuned"]["status"] == "ddtree"


def test_a_rerun_with_nothing_changed_tunes_nothing_and_a_new_release_tunes_again(tmp_path, capsys):
    run_module(service_autotune, args(tmp_path, measurements=measure()), capsys)
    state = tmp_path / "coder" / "autotune.json"
    before = state.read_text()
    # Other numbers, same key: the recorded choice stands and the file is untouched.
    code, result = run_module(service_autotune, args(tmp_path, measurements=measure(b8=(200.0, 2000.0))), capsys)
    assert code == 0 and result["changed"] is False and result["needs_tuning"] is False and result["tuned"] is False
    assert (result["choice"]["budget"], result["key_changes"]) == (4, [])
    assert "measurements were not used" in json.dumps(result["warnings"])
    assert state.read_text() == before
    # A new release: tuned again, the earlier tuning in the history.
    code, result = run_module(service_autotune, args(tmp_path, release_id="r2"), capsys)
    assert result["needs_tuning"] is True and result["key_changes"] == ["release_id"]
    code, result = run_module(
        service_autotune,
        args(tmp_path, release_id="r2", measurements=measure(b4=(90.0, 900.0), b8=(101.0, 1010.0))),
        capsys,
    )
    assert code == 0 and result["changed"] is True and result["choice"]["algorithm"] == "DFLASH"
    assert result["choice"]["status"] == "fallback"
    document = json.loads(state.read_text())
    assert document["current"]["release_id"] == "r2"
    assert [entry["release_id"] for entry in document["history"]] == ["r1"]
    # The fallback is what the plan runs: DFLASH, on the base release (it does not load the overlay).
    code, plan = run_module(
        service_plan, {"services": [CODER], "gpu_indices": [0, 1], "tuned": {"coder": result["choice"]}}, capsys
    )
    assert plan["services"][0]["algorithm"] == "DFLASH" and plan["services"][0]["loads_overlay"] is False


def test_check_mode_decides_and_diffs_but_writes_nothing(tmp_path, capsys):
    code, result = run_module(
        service_autotune, args(tmp_path, measurements=measure(), _ansible_check_mode=True, _ansible_diff=True), capsys
    )
    assert code == 0 and result["changed"] is True and result["choice"]["budget"] == 4
    assert result["diff"]["before"] == "" and json.loads(result["diff"]["after"])["current"]["choice"]["budget"] == 4
    assert not (tmp_path / "coder" / "autotune.json").exists()


def test_incomplete_measurements_fail_and_leave_the_state_as_it_was(tmp_path, capsys):
    run_module(service_autotune, args(tmp_path, measurements=measure()), capsys)
    state = tmp_path / "coder" / "autotune.json"
    before = state.read_text()
    rows = [row for row in measure() if not (row["algorithm"] == "DFLASH" and row["concurrency"] == 16)]
    code, result = run_module(service_autotune, args(tmp_path, release_id="r2", measurements=rows), capsys)
    assert code == 1 and result["problems"] == [
        "DFLASH was not measured at concurrency 16; every DDTREE setting is compared with it"
    ]
    assert "the state file was left as it was" in result["msg"]
    assert state.read_text() == before


def test_a_service_without_autotune_or_with_a_bad_one_is_refused(tmp_path, capsys):
    code, result = run_module(
        service_autotune, args(tmp_path, service=dict(CODER, speculative={"algorithm": "DDTREE", "budget": 8})), capsys
    )
    assert (
        code == 1
        and result["msg"] == "coder: speculative.autotune is not declared; only a DDTREE service with autotune is tuned"
    )
    bad = dict(CODER, speculative={"algorithm": "DDTREE", "autotune": {"min_gain": 1.5}})
    code, result = run_module(service_autotune, args(tmp_path, service=bad), capsys)
    assert code == 1 and "speculative.autotune.min_gain is 1.5" in result["msg"]


def test_the_plan_refuses_a_service_that_declares_autotune_but_was_not_tuned(capsys):
    code, result = run_module(service_plan, {"services": [CODER], "gpu_indices": [0, 1], "host": "ct200"}, capsys)
    assert code == 1 and result["problems"] == [
        "ct200: sglang_services[0] (coder): speculative.autotune is declared but no tuned choice was given in tuned; run "
        "ddtree.sglang.service_autotune for the candidate release first (docs/autotune.md)"
    ]


def test_the_documentation_says_what_the_argument_spec_does():
    from test_schemas import differences, documented, shape

    assert (
        differences(
            "ARGUMENT_SPEC", shape(service_autotune.ARGUMENT_SPEC), "DOCUMENTATION", shape(documented(service_autotune))
        )
        == []
    )


def test_it_says_what_to_run_and_what_was_chosen_before_and_a_changed_prompt_set_tunes_again(
    tmp_path, capsys, monkeypatch
):
    code, result = run_module(service_autotune, args(tmp_path), capsys)
    assert result["service"] == "coder" and result["previous_choice"] is None
    assert [(trial["label"], trial["instance"]["unit"], trial["instance"]["port"]) for trial in result["trials"]] == [
        ("DFLASH", "sglang-coder-autotune.service", 30100),
        ("DDTREE budget 4 top_k 4", "sglang-coder-autotune.service", 30100),
        ("DDTREE budget 8 top_k 4", "sglang-coder-autotune.service", 30100),
    ]
    assert result["key"]["parts"]["workload"] == {"prompts": "autotune-v1", "rounds": 2}
    run_module(service_autotune, args(tmp_path, measurements=measure()), capsys)
    code, result = run_module(service_autotune, args(tmp_path), capsys)
    assert result["needs_tuning"] is False and result["trials"] == [] and result["previous_choice"]["budget"] == 4
    monkeypatch.setattr(service_autotune, "PROMPT_SET", "autotune-v2")
    code, result = run_module(service_autotune, args(tmp_path, release_id="r2"), capsys)
    assert result["needs_tuning"] is True and result["key_changes"] == ["release_id", "workload"]
    # Check mode plans with the choice tuned before (the role's provisional choice).
    assert result["choice"] is None and result["previous_choice"]["algorithm"] == "DDTREE"


def test_the_plan_defers_an_untuned_service_and_validates_it_with_the_others(capsys):
    chat = {"name": "chat", "model_path": "/models/chat", "gpus": [2], "port": 30001}
    code, result = run_module(
        service_plan, {"services": [CODER, chat], "gpu_indices": [0, 1, 2], "untuned": "defer"}, capsys
    )
    assert (
        code == 0 and result["untuned"] == ["coder"] and [service["name"] for service in result["services"]] == ["chat"]
    )
    # Still validated: its spare GPU is chat's now.
    code, result = run_module(
        service_plan,
        {"services": [CODER, dict(chat, gpus=[1])], "gpu_indices": [0, 1], "untuned": "defer", "host": "ct200"},
        capsys,
    )
    assert code == 1 and result["problems"] == [
        "ct200: sglang_services[0] (coder): speculative.autotune.gpus: GPU 1 is used by service chat; the temporary instances need "
        "spare GPUs (free on ct200: none)"
    ]


def test_on_its_own_gpus_it_runs_the_trials_there_and_says_when_the_host_restores_the_service(tmp_path, capsys):
    own = dict(
        CODER,
        speculative={
            "algorithm": "DDTREE",
            "autotune": {"budgets": [4, 8], "top_k": [4], "concurrency": [1], "own_gpus": True},
        },
    )
    code, result = run_module(
        service_autotune, args(tmp_path, service=own, start_timeout=60, window_measure_allowance=40), capsys
    )
    assert code == 0 and result["own_window"] is True and result["needs_tuning"] is True
    assert [(trial["instance"]["port"], trial["instance"]["gpus"]) for trial in result["trials"]] == [(30000, [0])] * 3
    assert result["window_restore_after"] == 400  # (3 trials + 1) x (60 + 40)
    # Spare GPUs: no window, no restore.
    code, result = run_module(service_autotune, args(tmp_path), capsys)
    assert result["own_window"] is False and result["window_restore_after"] is None and len(result["trials"]) == 3
    # Tuned: nothing to run, so nothing to restore.
    assert result["window_restarted"] == []
    # Decided after its window stopped it while serving: the health gate judges it, restarted in this run.
    measurements = [row for row in measure() if row["concurrency"] == 1]
    window = {"serving": True, "commands": ["systemctl stop sglang-coder.service"]}
    code, result = run_module(
        service_autotune, args(tmp_path, service=own, measurements=measurements, window=window), capsys
    )
    assert code == 0 and result["tuned"] is True and result["window_restarted"] == ["coder"]
    code, result = run_module(service_autotune, args(tmp_path, service=own), capsys)
    assert result["needs_tuning"] is False and result["trials"] == [] and result["window_restore_after"] is None


def test_a_window_restore_that_would_fire_at_once_fails_before_anything_stops(tmp_path, capsys):
    own = dict(CODER, speculative={"algorithm": "DDTREE", "autotune": {"own_gpus": True}})
    code, result = run_module(service_autotune, args(tmp_path, service=own, window_measure_allowance=0), capsys)
    assert code == 1 and "coder: a window tuning needs at least one trial and positive timeouts" in result["msg"]


def test_a_tuning_appends_its_history_line_and_a_rerun_appends_none(tmp_path, capsys):
    history = tmp_path / "coder" / "history.jsonl"
    history.parent.mkdir()
    history.write_text('{"event": "rollback"}\n')
    code, result = run_module(
        service_autotune, args(tmp_path, measurements=measure(), history_file=str(history)), capsys
    )
    assert code == 0 and result["tuned"] is True
    lines = history.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1]) == result["history"]
    assert json.loads(lines[1])["event"] == "autotune"
    code, result = run_module(
        service_autotune, args(tmp_path, measurements=measure(), history_file=str(history)), capsys
    )
    assert code == 0 and result["tuned"] is False and len(history.read_text().splitlines()) == 2


def test_a_new_history_file_is_the_owners_and_groups_alone(tmp_path, capsys):
    history = tmp_path / "coder" / "history.jsonl"
    code, result = run_module(
        service_autotune, args(tmp_path, measurements=measure(), history_file=str(history)), capsys
    )
    assert code == 0 and history.stat().st_mode & 0o777 == 0o640 & ~_umask()


def _umask():
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_check_mode_appends_no_history(tmp_path, capsys):
    history = tmp_path / "coder" / "history.jsonl"
    run_module(
        service_autotune,
        args(tmp_path, measurements=measure(), history_file=str(history), _ansible_check_mode=True),
        capsys,
    )
    assert not history.exists()


def test_each_trial_starts_within_the_services_own_start_timeout(tmp_path, capsys):
    slow = dict(CODER, health={"start_timeout": 1800})
    code, result = run_module(service_autotune, args(tmp_path, service=slow, start_timeout=900), capsys)
    assert code == 0 and [trial["start_timeout"] for trial in result["trials"]] == [1800.0] * 3
    code, result = run_module(service_autotune, args(tmp_path, start_timeout=900), capsys)
    assert [trial["start_timeout"] for trial in result["trials"]] == [900.0] * 3


def test_each_trial_runs_from_the_release_its_setting_runs_on(tmp_path, capsys):
    """DDTREE loads the overlay: the candidate; DFLASH runs as the service would, on the base release."""
    code, result = run_module(service_autotune, args(tmp_path, releases_root="/r", base_release_id="base1"), capsys)
    assert code == 0
    assert [(trial["label"], trial["release_dir"]) for trial in result["trials"]] == [
        ("DFLASH", "/r/base1"),
        ("DDTREE budget 4 top_k 4", "/r/r1"),
        ("DDTREE budget 8 top_k 4", "/r/r1"),
    ]
    code, result = run_module(service_autotune, args(tmp_path, releases_root="/r"), capsys)
    assert code == 1 and "coder: DFLASH runs on the base release, and no base_release_id was given" in result["msg"]
