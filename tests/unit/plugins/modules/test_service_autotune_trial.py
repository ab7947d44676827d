"""service_autotune_trial: it runs an entry of service_autotune's `trials` as given (its instance, release,
setting, concurrencies and start timeout); check mode names the files and measures nothing."""

from conftest import run_module
from service_samples import tuned_coder

from ansible_collections.ddtree.sglang.plugins.modules import service_autotune, service_autotune_trial

CODER = tuned_coder()


def planned_trials(tmp_path, capsys):
    code, result = run_module(
        service_autotune,
        {
            "service": CODER,
            "release_id": "r1",
            "base_release_id": "base",
            "releases_root": "/opt/sglang/releases",
            "state_file": str(tmp_path / "coder" / "autotune.json"),
        },
        capsys,
    )
    assert code == 0 and result["needs_tuning"] is True, result.get("msg")
    return result["trials"]


def trial_args(trial, **extra):
    return dict(
        {
            "trial": trial,
            "services_root": "/opt/sglang/services",
            "config_dir": "/etc/sglang",
            "state_root": "/var/lib/sglang",
            "owner": "sglang",
            "group": "sglang",
            "unit_file": "[Unit]\n",
            "environment_file": "A=1\n",
            "_ansible_check_mode": True,
        },
        **extra,
    )


def test_each_trial_service_autotune_plans_is_run_as_given(tmp_path, capsys):
    trials = planned_trials(tmp_path, capsys)
    assert [trial["label"] for trial in trials] == ["DFLASH", "DDTREE budget 4 top_k 4", "DDTREE budget 8 top_k 4"]
    for trial in trials:
        code, result = run_module(service_autotune_trial, trial_args(trial), capsys)
        assert code == 0, result
        assert result["files"]["unit"] == "/etc/systemd/system/sglang-coder-autotune.service"
        assert result["files"]["unit_dir"] == "/opt/sglang/services/coder-autotune"
        assert result["measurements"] == []


def test_a_trial_whose_instance_lacks_its_port_fails_and_names_it(tmp_path, capsys):
    trial = planned_trials(tmp_path, capsys)[0]
    trial["instance"] = dict(trial["instance"], port=None)
    code, result = run_module(service_autotune_trial, trial_args(trial), capsys)
    assert code == 1 and result["msg"] == "trial DFLASH: its instance has no port"


def test_a_non_positive_start_timeout_fails_before_anything_is_written(tmp_path, capsys):
    trial = dict(planned_trials(tmp_path, capsys)[1], start_timeout=0)
    code, result = run_module(service_autotune_trial, trial_args(trial), capsys)
    assert code == 1 and "coder-autotune: start_timeout is 0.0; it must be above 0" in result["msg"]
