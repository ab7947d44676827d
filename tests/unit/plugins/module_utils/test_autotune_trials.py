"""Where a tuned service is measured: the temporary instances, and the host rules for their GPUs and port."""

import copy

import pytest
from service_samples import coder

from ansible_collections.ddtree.sglang.plugins.module_utils import autotune_trials, services

CODER = coder(
    api_key="s3cret",
    environment={"HF_HOME": "/models/hf"},
    extra_args=["--mem-fraction-static", "0.8"],
    health={"min_accept_length": 2.0},
    speculative={
        "algorithm": "DDTREE",
        "allow_hybrid_unsafe": True,
        "autotune": {"budgets": [4, 8], "top_k": [4], "concurrency": [1, 16], "gpus": [2, 3], "port": 30100},
    },
)
EIGHT = list(range(8))


def test_each_setting_runs_in_turn_dflash_first_as_the_service_would_on_the_spare_gpus_and_port():
    trials = autotune_trials.trials(CODER)
    assert [trial["label"] for trial in trials] == ["DFLASH", "DDTREE budget 4 top_k 4", "DDTREE budget 8 top_k 4"]
    assert all(trial["concurrency"] == [1, 16] for trial in trials)
    dflash, budget8 = trials[0]["instance"], trials[2]["instance"]
    assert (dflash["name"], dflash["unit"], dflash["port"], dflash["gpus"]) == (
        "coder-autotune",
        "sglang-coder-autotune.service",
        30100,
        [2, 3],
    )
    # The service's own model, drafter, tp, environment and extra args; the spare GPUs; the service's model name.
    assert dflash["environment"] == {"CUDA_VISIBLE_DEVICES": "2,3", "HF_HOME": "/models/hf"}
    assert dflash["flags"] == [
        "--model-path",
        "/models/coder",
        "--served-model-name",
        "coder",
        "--host",
        "127.0.0.1",
        "--port",
        "30100",
        "--tp-size",
        "2",
        "--enable-metrics",
        "--speculative-algorithm",
        "DFLASH",
        "--speculative-draft-model-path",
        "/models/coder-dflash",
        "--mem-fraction-static",
        "0.8",
    ]
    assert (dflash["algorithm"], dflash["loads_overlay"]) == ("DFLASH", False)
    assert budget8["flags"][11:] == [
        "--speculative-algorithm",
        "DDTREE",
        "--speculative-draft-model-path",
        "/models/coder-dflash",
        "--speculative-ddtree-budget",
        "8",
        "--speculative-ddtree-top-k",
        "4",
        "--speculative-ddtree-allow-hybrid-unsafe",
        "--attention-backend",
        "triton",
        "--mem-fraction-static",
        "0.8",
    ]
    assert (budget8["algorithm"], budget8["loads_overlay"], budget8["has_api_key"]) == ("DDTREE", True, True)
    assert "s3cret" not in repr(trials)  # the key reaches the instance through its key file, never its entry
    assert (
        CODER["speculative"]["autotune"]["gpus"] == [2, 3] and CODER["port"] == 30000
    )  # the declaration is not changed


def with_autotune(service=None, **fields):
    service = copy.deepcopy(service or CODER)
    service["speculative"]["autotune"].update(fields)
    return service


@pytest.mark.parametrize(
    "declared, others, message",
    [
        (
            with_autotune(gpus=None, port=None),
            [],
            "ct200: sglang_services[0] (coder): speculative.autotune.gpus is not set; each setting is measured on a temporary instance "
            "before the candidate takes traffic: set autotune.gpus to 2 spare GPU(s) (free on ct200: 2, 3, 4, 5, 6, 7) and autotune.port "
            "to measure beside the service, or autotune.own_gpus: true to measure on its own GPUs in this host's rollout window (the "
            "service stops while its grid runs), or remove autotune and set budget and top_k",
        ),
        (with_autotune(gpus=None, port=None, own_gpus=False), [], "speculative.autotune.gpus is not set"),
        (
            with_autotune(own_gpus=True),
            [],
            "speculative.autotune.own_gpus is true, but gpus [2, 3] and port 30100 are set; the settings are measured either on spare "
            "GPUs (gpus and port) or on the service's own (own_gpus: true): remove one",
        ),
        (with_autotune(port=None, own_gpus=True), [], "speculative.autotune.own_gpus is true, but gpus [2, 3] is set;"),
        (
            with_autotune(gpus=None, port=None, own_gpus="yes"),
            [],
            "speculative.autotune.own_gpus is 'yes'; it must be true (measure on the service's own GPUs and port, the service stopped "
            "while its grid runs) or false",
        ),
        (
            with_autotune(gpus=[2]),
            [],
            "speculative.autotune.gpus [2] has 1 GPU(s), but the service runs on 2; measure on as many as it runs on (free on ct200: 2, 3, 4, 5, 6, 7)",
        ),
        (
            with_autotune(gpus=[2, 9]),
            [],
            "speculative.autotune.gpus: GPU 9 does not exist on ct200, which has GPUs 0, 1, 2, 3, 4, 5, 6, 7",
        ),
        (
            CODER,
            [
                {
                    "name": "coder-shadow",
                    "shadow_of": "coder",
                    "model_path": "/m",
                    "gpus": [2, 3],
                    "port": 30001,
                    "speculative": {"algorithm": "DDTREE"},
                }
            ],
            "speculative.autotune.gpus: GPU 2 is used by service coder-shadow; the temporary instances need spare GPUs (free on ct200: 4, 5, 6, 7)",
        ),
        (
            with_autotune(port=None),
            [],
            "speculative.autotune.port is not set; give the temporary instances a port of their own, e.g. 30100",
        ),
        (
            CODER,
            [{"name": "chat", "model_path": "/m", "gpus": [4], "port": 30100}],
            "speculative.autotune.port 30100 is used by service chat; give the temporary instances a port of their own",
        ),
        (
            CODER,
            [{"name": "coder-autotune", "model_path": "/m", "gpus": [4], "port": 30200}],
            "a service is named coder-autotune, the name of this service's temporary tuning instance; rename it",
        ),
        (
            dict(CODER, release="0123456789ab"),
            [],
            "release '0123456789ab' is pinned, but speculative.autotune tunes for the candidate release (and may fall back to DFLASH, which "
            "runs the base release, not the pin): remove release to tune, or remove autotune and pin the setting tuned before",
        ),
        (
            with_autotune(gpus=[2, 2]),
            [],
            "speculative.autotune.gpus is [2, 2]; it must be a non-empty list of distinct GPU indices",
        ),
        (with_autotune(port=0), [], "speculative.autotune.port is 0; it must be a TCP port (1-65535)"),
    ],
)
def test_where_it_measures_is_checked_with_the_hosts_gpus_and_the_other_services(declared, others, message):
    problems = services.service_problems([declared] + others, EIGHT, "ct200")
    assert any(message in problem for problem in problems), problems


def test_a_right_declaration_beside_other_services_has_no_problems():
    chat = {"name": "chat", "model_path": "/m", "gpus": [4], "port": 30001}
    assert services.service_problems([CODER, chat], EIGHT, "ct200") == []


ON_ITS_OWN = with_autotune(gpus=None, port=None, own_gpus=True)


def test_a_host_without_spare_gpus_measures_on_the_services_own_gpus_and_port_under_the_trial_name():
    # Every GPU of a two-GPU host serves coder: no spare GPU, and none needed with own_gpus.
    assert services.service_problems([ON_ITS_OWN], [0, 1], "ct200") == []
    trials = autotune_trials.trials(ON_ITS_OWN)
    assert [trial["label"] for trial in trials] == ["DFLASH", "DDTREE budget 4 top_k 4", "DDTREE budget 8 top_k 4"]
    for trial in trials:
        instance = trial["instance"]
        assert (instance["name"], instance["unit"], instance["port"], instance["gpus"]) == (
            "coder-autotune",
            "sglang-coder-autotune.service",
            30000,
            [0, 1],
        )
        assert instance["environment"]["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert instance["flags"][6:8] == ["--port", "30000"]


def test_own_gpus_is_where_not_what_it_measures_so_it_does_not_change_the_tuning_key():
    from ansible_collections.ddtree.sglang.plugins.module_utils.autotune import tuning_key

    assert tuning_key(ON_ITS_OWN, "r1")["digest"] == tuning_key(CODER, "r1")["digest"]


@pytest.mark.parametrize(
    "trials, start, allowance, seconds",
    [
        (3, 900, 900, 7200),  # every trial's start and measuring, and one more of each
        (1, 60, 30.5, 181),  # rounded up
        (17, 900, 900, 32400),
    ],
)
def test_the_hosts_own_restore_waits_for_every_trial_and_one_more(trials, start, allowance, seconds):
    assert autotune_trials.window_restore_after(trials, start, allowance) == seconds


@pytest.mark.parametrize("trials, start, allowance", [(0, 900, 900), (3, 0, 900), (3, 900, -1)])
def test_a_restore_that_could_fire_at_once_is_refused(trials, start, allowance):
    with pytest.raises(ValueError, match="at least one trial and positive timeouts"):
        autotune_trials.window_restore_after(trials, start, allowance)


def test_a_trial_instances_files_are_where_the_services_own_are_and_it_is_stopped_before_they_go():
    files = autotune_trials.trial_files(
        "coder-autotune",
        "sglang-coder-autotune.service",
        "/opt/sglang/services",
        "/etc/sglang",
        "/var/lib/sglang",
        "/etc/systemd/system",
    )
    assert files == {
        "unit": "/etc/systemd/system/sglang-coder-autotune.service",
        "environment": "/etc/sglang/coder-autotune.env",
        "api_key": "/etc/sglang/coder-autotune.api-key",
        "unit_dir": "/opt/sglang/services/coder-autotune",
        "state_dir": "/var/lib/sglang/coder-autotune",
    }
    assert autotune_trials.trial_start_commands("sglang-coder-autotune.service") == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "restart", "sglang-coder-autotune.service"],
    ]
    assert autotune_trials.trial_stop_commands("sglang-coder-autotune.service")[0] == [
        "systemctl",
        "stop",
        "sglang-coder-autotune.service",
    ]


@pytest.mark.parametrize(
    "window_stop, expected",
    [
        ({"serving": True, "commands": []}, ["coder"]),
        ({"serving": False, "commands": []}, []),
        # No window (spare GPUs, check mode, nothing to tune): the stop did not run.
        ({}, []),
        (None, []),
    ],
)
def test_a_window_restarted_the_service_only_when_it_was_serving(window_stop, expected):
    assert autotune_trials.window_restarted("coder", window_stop) == expected


def test_a_trial_names_its_instance_release_setting_and_timeout_for_the_measuring_step():
    trial = {
        "label": "DFLASH",
        "instance": {
            "name": "coder-autotune",
            "unit": "sglang-coder-autotune.service",
            "host": "0.0.0.0",
            "port": 30100,
        },
        "release_dir": "/opt/sglang/releases/base",
        "setting": {"algorithm": "DFLASH", "budget": None, "top_k": None},
        "concurrency": [1],
        "start_timeout": 600.0,
    }
    assert autotune_trials.trial_params(trial) == {
        "name": "coder-autotune",
        "unit": "sglang-coder-autotune.service",
        "host": "0.0.0.0",
        "port": 30100,
        "release_dir": "/opt/sglang/releases/base",
        "setting": trial["setting"],
        "concurrency": [1],
        "start_timeout": 600.0,
    }
    with pytest.raises(ValueError, match="trial DFLASH: its instance has no unit, port"):
        autotune_trials.trial_params(dict(trial, instance={"name": "coder-autotune"}))
