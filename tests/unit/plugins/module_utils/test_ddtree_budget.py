"""DDTREE's budget as services declare it, held to the overlay's own parser of the flag."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils import ddtree_budget
from ansible_collections.ddtree.sglang.plugins.module_utils.services import service_flags, service_problems

OVERLAY_SETTINGS = (
    Path(__file__).resolve().parents[4] / "sglang_overlay" / "src" / "sglang_overlay" / "adapter" / "settings.py"
)


def overlay_settings():
    """The overlay's settings module (pure Python), loaded by path: the flag's own parser."""
    spec = importlib.util.spec_from_file_location("ddtree_overlay_settings", OVERLAY_SETTINGS)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


GOOD = [63, "63", 511, {1: 127, 4: 63, 16: 15, 48: 7}, "1:127,4:63,16:15,48:7", " 16:15, 1:63 ", {"1": 31, "8": 7}]
BAD = [0, -1, 512, True, "abc", "1:63,1:31", "1:63,4", "0:15", "4:0", "1:600", {}, {1: "x"}]


@pytest.mark.parametrize("value", GOOD)
def test_what_services_accept_the_overlay_parses_to_the_same_budget(value):
    ours = ddtree_budget.parse_budget(value)
    theirs = overlay_settings().parse_budget(ddtree_budget.format_budget(value), "--speculative-ddtree-budget")
    assert ours == theirs


@pytest.mark.parametrize("value", BAD)
def test_what_services_refuse_the_overlay_refuses(value):
    with pytest.raises(ValueError):
        ddtree_budget.parse_budget(value)
    settings = overlay_settings()
    with pytest.raises((settings.DDTreeConfigError, ValueError)):
        settings.parse_budget(value if not isinstance(value, dict) or value else "", "X")


def test_the_widest_tree_is_declared_alike():
    assert ddtree_budget.MAX_BUDGET == overlay_settings().MAX_BUDGET


def test_levels_make_a_schedule_only_when_their_budgets_differ():
    assert ddtree_budget.schedule_from_levels({"1": 63, "16": 15, "64": 7}) == "1:63,16:15,64:7"
    assert ddtree_budget.schedule_from_levels({"1": 15, "16": 15}) == 15


def service(budget):
    return {
        "name": "coder",
        "model_path": "/m",
        "draft_model_path": "/d",
        "gpus": [0],
        "port": 30000,
        "speculative": {"algorithm": "DDTREE", "budget": budget, "top_k": 8},
    }


def test_a_service_declares_a_schedule_wherever_it_declares_a_budget():
    flags = service_flags(service({1: 63, 16: 15, 48: 7}))
    assert flags[flags.index("--speculative-ddtree-budget") + 1] == "1:63,16:15,48:7"
    assert not [p for p in service_problems([service({1: 63, 16: 15})], [0], host="ct200") if "budget" in p]
    problems = " ".join(service_problems([service("1:63,16:0")], [0], host="ct200"))
    assert "speculative.budget" in problems and "batch size 16" in problems and "{1: 63, 16: 15, 48: 7}" in problems
