"""Services as data: every cross-field rule, and the flags and environment a service becomes."""

import copy

import pytest
from service_samples import coder

from ansible_collections.ddtree.sglang.plugins.module_utils import services

CODER = coder()
CHAT = {
    "name": "chat",
    "model_path": "/models/chat",
    "gpus": [2],
    "port": 30001,
    "speculative": {"algorithm": "NEXTN", "num_steps": 3},
}
EIGHT = list(range(8))


def with_changes(service, **changes):
    service = copy.deepcopy(service)
    for key, value in changes.items():
        if key.startswith("speculative_"):
            service["speculative"][key[len("speculative_") :]] = value
        else:
            service[key] = value
    return service


def test_good_services_have_no_problems():
    assert services.service_problems([CODER, CHAT], EIGHT, "ct200") == []


@pytest.mark.parametrize(
    "service_list, message",
    [
        (
            [with_changes(CODER, speculative_algorithm="DDTRE")],
            "speculative.algorithm 'DDTRE' is not one of NONE, EAGLE",
        ),
        ([with_changes(CODER, speculative_budget=0)], "speculative.budget: the budget is 0; it must be >= 1"),
        ([with_changes(CODER, speculative_top_k=0)], "speculative.top_k is 0; DDTREE needs an integer >= 1"),
        (
            [with_changes(CODER, gpus=[9], tp_size=1)],
            "GPU index 9 does not exist on ct200, which has GPUs 0, 1, 2, 3, 4, 5, 6, 7",
        ),
        ([CODER, with_changes(CHAT, gpus=[1])], "sglang_services[1] (chat): GPU 1 is also used by service coder"),
        (
            [CODER, with_changes(CHAT, port=30000)],
            "sglang_services[1] (chat): port 30000 is also used by service coder",
        ),
        ([with_changes(CODER, draft_model_path=None)], "speculative.algorithm DDTREE needs draft_model_path"),
        (
            [CODER, with_changes(CHAT, name="coder", port=1, gpus=[5])],
            "name 'coder' is also used by sglang_services[0]",
        ),
        ([with_changes(CODER, name="Coder!")], "name 'Coder!' must be 1-40 lowercase letters"),
        ([with_changes(CODER, tp_size=3)], "tp_size 3 does not divide the 2 GPU(s) [0, 1]"),
        ([with_changes(CODER, gpus=[])], "gpus is empty"),
        ([with_changes(CHAT, speculative_num_steps=0)], "speculative.num_steps is 0"),
    ],
)
def test_each_rule_names_service_field_and_value(service_list, message):
    problems = services.service_problems(service_list, EIGHT, "ct200")
    assert any(message in problem for problem in problems), problems


def test_ddtree_flags():
    assert services.service_flags(CODER) == [
        "--model-path",
        "/models/coder",
        "--served-model-name",
        "coder",
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
        "--tp-size",
        "2",
        "--enable-metrics",
        "--speculative-algorithm",
        "DDTREE",
        "--speculative-draft-model-path",
        "/models/coder-dflash",
        "--speculative-ddtree-budget",
        "15",
        "--speculative-ddtree-top-k",
        "8",
        "--attention-backend",
        "triton",
    ]


def test_nextn_flags_and_extra_args_never_the_api_key():
    flags = services.service_flags(with_changes(CHAT, api_key="s3cret", extra_args=["--enable-metrics"]))
    assert flags[flags.index("--speculative-algorithm") + 1] == "NEXTN"
    assert flags[flags.index("--speculative-num-steps") + 1] == "3"
    assert "--speculative-draft-model-path" not in flags
    # The flags are the server's argv: the key reaches it on standard input instead.
    assert "--api-key" not in flags and not any("s3cret" in flag or "API_KEY" in flag for flag in flags)
    assert flags[-1] == "--enable-metrics" and flags.count("--enable-metrics") == 1  # declared once, not twice


def test_metrics_are_exported_by_default_and_a_service_opts_out():
    assert "--enable-metrics" in services.service_flags(CHAT)
    assert "--enable-metrics" not in services.service_flags(with_changes(CHAT, metrics=False))


def test_unit_entry_is_what_the_unit_templates_read_and_never_the_key():
    entry = services.unit_entry(with_changes(CODER, api_key="s3cret", environment={"NCCL_DEBUG": "WARN"}))
    assert entry["name"] == "coder" and entry["unit"] == "sglang-coder.service"
    assert entry["flags"] == services.service_flags(CODER)
    assert entry["exec_args"].startswith("--model-path /models/coder --served-model-name coder ")
    assert entry["environment"] == {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "WARN"}
    assert (entry["algorithm"], entry["loads_overlay"]) == ("DDTREE", True)
    assert (entry["gpus"], entry["port"], entry["host"], entry["served_model_name"]) == (
        [0, 1],
        30000,
        "127.0.0.1",
        "coder",
    )
    assert entry["has_api_key"] is True and "s3cret" not in repr(entry)
    nextn = services.unit_entry(CHAT)
    assert (nextn["algorithm"], nextn["loads_overlay"], nextn["has_api_key"]) == ("NEXTN", False, False)


@pytest.mark.parametrize("arg", ["--api-key", "--api-key=s3cret", "--admin-api-key"])
def test_a_secret_flag_in_extra_args_is_refused_without_printing_its_value(arg):
    problems = services.service_problems(
        [with_changes(CODER, extra_args=["--enable-metrics", arg, "s3cret"])], EIGHT, "ct200"
    )
    flag = arg.split("=")[0]
    assert problems == [
        "ct200: sglang_services[0] (coder): extra_args holds %s, which would put its value in the "
        "server's command line; set the service's api_key instead (it reaches the server on "
        "standard input)" % flag
    ]
    assert "s3cret" not in problems[0]


def test_environment_never_holds_the_api_key():
    env = services.service_environment(with_changes(CODER, api_key="s3cret", environment={"SGLANG_DDTREE_BUDGET": 12}))
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1", "SGLANG_DDTREE_BUDGET": "12"}


@pytest.mark.parametrize(
    "arg, quoted",
    [
        ("/models/coder", "/models/coder"),
        ("${SGLANG_API_KEY}", "${SGLANG_API_KEY}"),
        ("a b", '"a b"'),
        ('say "hi"', '"say \\"hi\\""'),
    ],
)
def test_systemd_quote(arg, quoted):
    assert services.systemd_quote(arg) == quoted


def test_gate_settings_take_the_services_own_values_over_the_role_defaults():
    slow = dict(CODER, health={"start_timeout": 1800, "no_progress_timeout": None, "min_accept_length": 2.5})
    defaults = {"start_timeout": 900, "no_progress_timeout": 120}
    assert services.gate_settings(slow, defaults) == {
        "start_timeout": 1800,
        "no_progress_timeout": 120,
        "min_accept_length": 2.5,
    }
    # Unset both ways: left out, so the module's own defaults apply.
    assert services.gate_settings(CODER, {}) == {}


SHADOW = {
    "name": "coder-shadow",
    "model_path": "/models/coder",
    "draft_model_path": "/models/coder-dflash",
    "gpus": [4, 5],
    "tp_size": 2,
    "port": 30100,
    "speculative": {"algorithm": "DDTREE", "budget": 31},
    "shadow_of": "coder",
}


def test_a_shadow_on_spare_gpus_and_its_own_port_is_accepted():
    assert services.service_problems([CODER, CHAT, SHADOW], EIGHT, "ct200") == []
    assert services.spare_gpus([CODER, CHAT, SHADOW], EIGHT) == [3, 4, 5, 6, 7]


@pytest.mark.parametrize(
    "shadow, message",
    [
        (
            with_changes(SHADOW, shadow_of="coderr"),
            "ct200: sglang_services[2] (coder-shadow): shadow_of 'coderr' names no service on ct200 (production services there: chat, coder)",
        ),
        (with_changes(SHADOW, shadow_of="coder-shadow"), "shadow_of 'coder-shadow' names the service itself"),
        (
            with_changes(SHADOW, gpus=[1, 2]),
            "(coder-shadow): a shadow needs spare GPUs of its own, but GPU 1 is used by service coder; give it spare GPUs (free on ct200: 3, 4, 5, 6, 7)",
        ),
        (
            with_changes(SHADOW, speculative_algorithm="NEXTN"),
            "a shadow runs the candidate release, so its algorithm must be DDTREE, not NEXTN",
        ),
        (with_changes(SHADOW, release="aaaaaaaaaaaa"), "a shadow follows the candidate; remove release 'aaaaaaaaaaaa'"),
        (with_changes(SHADOW, port=30000), "(coder-shadow): port 30000 is also used by service coder"),
    ],
)
def test_each_broken_shadow_rule_is_named(shadow, message):
    problems = services.service_problems([CODER, CHAT, shadow], EIGHT, "ct200")
    assert any(message in problem for problem in problems), problems


def test_a_shadow_on_a_host_without_spare_gpus_says_so_and_a_shadow_of_a_shadow_names_the_production_service():
    chat = with_changes(CHAT, gpus=[0, 1], tp_size=2)
    shadow = with_changes(SHADOW, gpus=[1], tp_size=1, shadow_of="chat")
    assert services.service_problems([chat, shadow], [0, 1], "ct129") == [
        "ct129: sglang_services[1] (coder-shadow): a shadow needs spare GPUs of its own, but GPU 1 is used by service chat; "
        "ct129 has no spare GPU (every GPU serves production); remove the shadow or free GPUs for it"
    ]
    second = with_changes(SHADOW, name="second", gpus=[6], tp_size=1, port=30101, shadow_of="coder-shadow")
    assert services.service_problems([CODER, SHADOW, second], EIGHT, "ct200") == [
        "ct200: sglang_services[2] (second): shadow_of 'coder-shadow' names a shadow; name the production service 'coder' it shadows"
    ]


def test_a_production_service_has_one_shadow_and_only_a_shadow_has_a_tolerance_below_one():
    second = with_changes(SHADOW, name="second", gpus=[6], tp_size=1, port=30101)
    assert services.service_problems([CODER, SHADOW, second], EIGHT, "ct200") == [
        "ct200: sglang_services[2] (second): coder has a shadow already, coder-shadow; give a production service one shadow "
        "(it decides its promotion)"
    ]
    assert services.service_problems([CODER, with_changes(SHADOW, shadow_max_slowdown=0.25)], EIGHT, "ct200") == []
    assert services.service_problems([CODER, with_changes(SHADOW, shadow_max_slowdown=1.0)], EIGHT, "ct200") == [
        "ct200: sglang_services[1] (coder-shadow): shadow_max_slowdown is 1.0; it is a share of production's tokens/s, "
        "at least 0 and below 1 (0.1: 90%)"
    ]
    assert services.service_problems([with_changes(CODER, shadow_max_slowdown=0.2)], EIGHT, "ct200") == [
        "ct200: sglang_services[0] (coder): shadow_max_slowdown is set, but the service is no shadow; set shadow_of or remove it"
    ]
