"""DDTREE runs on the Triton attention backend (docs/decisions/ddtree-attention-backend.md): the collection sets
the flag when a service does not, and refuses any other backend for a DDTREE service in the plan."""

import copy

import pytest
from service_samples import coder

from ansible_collections.ddtree.sglang.plugins.module_utils import services

CODER = coder()
EIGHT = list(range(8))


def coder(algorithm="DDTREE", extra_args=()):
    service = copy.deepcopy(CODER)
    service["speculative"]["algorithm"] = algorithm
    if algorithm != "DDTREE":
        service["speculative"] = {"algorithm": algorithm}
    service["extra_args"] = list(extra_args)
    return service


def backend_flags(flags):
    return [(flag, flags[position + 1]) for position, flag in enumerate(flags) if flag == "--attention-backend"]


def test_ddtree_gets_the_triton_backend_when_it_says_none():
    assert backend_flags(services.service_flags(coder())) == [("--attention-backend", "triton")]


@pytest.mark.parametrize(
    "extra_args", [["--attention-backend", "triton"], ["--attention-backend=triton"], ["--attention-b", "triton"]]
)
def test_ddtree_that_says_triton_keeps_its_own_flag_once(extra_args):
    flags = services.service_flags(coder(extra_args=extra_args))
    assert flags[-len(extra_args) :] == extra_args
    assert sum(1 for flag in flags if flag.startswith("--attention-b")) == 1
    assert services.service_problems([coder(extra_args=extra_args)], EIGHT, "ct200") == []


@pytest.mark.parametrize("algorithm", ["DFLASH", "NEXTN", "NONE"])
def test_other_algorithms_render_as_before_and_may_use_any_backend(algorithm):
    plain = services.service_flags(coder(algorithm))
    assert not [flag for flag in plain if "attention" in flag]
    service = coder(algorithm, ["--attention-backend", "flashinfer"])
    if algorithm == "NONE":
        service.pop("draft_model_path")
    assert services.service_flags(service)[-2:] == ["--attention-backend", "flashinfer"]
    assert services.service_problems([service], EIGHT, "ct200") == []


@pytest.mark.parametrize(
    "extra_args, flag, value",
    [
        (["--attention-backend", "flashinfer"], "--attention-backend", "flashinfer"),
        (["--attention-backend=fa3"], "--attention-backend", "fa3"),
        (["--attention-backe", "flashinfer"], "--attention-backend", "flashinfer"),
        (["--prefill-attention-backend", "flashinfer"], "--prefill-attention-backend", "flashinfer"),
        (["--attention-backend", "triton", "--decode-attention-backend=fa3"], "--decode-attention-backend", "fa3"),
    ],
)
def test_ddtree_on_another_backend_is_refused_naming_the_flag_the_value_and_the_fix(extra_args, flag, value):
    problems = services.service_problems([coder(extra_args=extra_args)], EIGHT, "ct200")
    assert problems == [
        "ct200: sglang_services[0] (coder): %s %s is not proven with DDTREE's tree mask; use triton (or drop "
        "the flag: the collection sets --attention-backend triton for DDTREE) or run the service with DFLASH"
        % (flag, value)
    ]


def test_flags_that_only_look_alike_are_not_backends():
    extra = [
        "--attention-context-parallel-size",
        "2",
        "--mm-attention-backend",
        "sdpa",
        "--speculative-draft-attention-backend",
        "fa3",
    ]
    assert services.attention_backends(extra) == {}
    assert services.service_problems([coder(extra_args=extra)], EIGHT, "ct200") == []
