"""Which release each service runs: candidate, pin, or the base release (no overlay)."""

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils import release, service_releases
from ansible_collections.ddtree.sglang.plugins.module_utils.service_releases import (
    choose_releases,
    release_pin_problems,
    resolve_pin,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.services import service_problems

REVISION_A = "5e1f3a2b9c0d5e1f3a2b9c0d5e1f3a2b9c0d5e1f"
RELEASES = {
    "aaaaaaaaaaaa": {"source_revision": REVISION_A, "stack_id": "stack1", "overlay": True},
    "bbbbbbbbbbbb": {"source_revision": "0b7e3f2a9c1d" + "0" * 28, "stack_id": "stack1", "overlay": True},
    "cccccccccccc": {"source_revision": "none", "stack_id": "stack1", "overlay": False},
}
CODER = {"name": "coder", "algorithm": "DDTREE", "release": "candidate"}
CHAT = {"name": "chat", "algorithm": "NEXTN", "release": "candidate"}


def test_a_non_ddtree_service_runs_the_base_release_whatever_the_candidate():
    first, problems_first = choose_releases([CODER, CHAT], "aaaaaaaaaaaa", "cccccccccccc", RELEASES, "stack1")
    second, problems_second = choose_releases([CODER, CHAT], "bbbbbbbbbbbb", "cccccccccccc", RELEASES, "stack1")
    assert problems_first == problems_second == []
    assert (
        first["chat"]
        == second["chat"]
        == {
            "release_id": "cccccccccccc",
            "follows": "base",
            "overlay": False,
            "reason": "NEXTN does not load the overlay: the base release (the stack alone)",
        }
    )
    assert (first["coder"]["release_id"], second["coder"]["release_id"]) == ("aaaaaaaaaaaa", "bbbbbbbbbbbb")
    assert first["coder"]["follows"] == "candidate" and first["coder"]["reason"] == "follows the rollout's candidate"


@pytest.mark.parametrize("algorithm", ["NONE", "EAGLE", "EAGLE3", "NEXTN", "DFLASH", "STANDALONE", "NGRAM"])
def test_only_ddtree_loads_the_overlay(algorithm):
    assert not service_releases.loads_overlay(algorithm)
    assert service_releases.loads_overlay("DDTREE")


def test_base_release_id_follows_the_stack_and_extra_wheels_never_the_overlay():
    base = release.base_release_id("stack1", ["w1"])
    assert base == release.base_release_id("stack1", ["w1"])
    assert base != release.base_release_id("stack2", ["w1"]) and base != release.base_release_id("stack1", ["w2"])


@pytest.mark.parametrize(
    "pin, expected",
    [
        ("bbbbbbbbbbbb", "bbbbbbbbbbbb"),  # by release id
        (REVISION_A, "aaaaaaaaaaaa"),  # by full revision
        (REVISION_A[:7], "aaaaaaaaaaaa"),  # by a short hash
    ],
)
def test_a_pin_by_id_or_revision_stays_on_its_release_while_the_candidate_moves(pin, expected):
    coder = dict(CODER, release=pin)
    for candidate in ("aaaaaaaaaaaa", "bbbbbbbbbbbb"):
        choices, problems = choose_releases([coder], candidate, None, RELEASES, "stack1")
        assert problems == []
        assert choices["coder"]["release_id"] == expected and choices["coder"]["follows"] == "pin"
        assert choices["coder"]["reason"].startswith("pinned by release: %s (revision " % pin)


def test_a_pin_to_a_release_not_on_the_host_fails_naming_it_the_releases_there_and_the_fix():
    choices, problems = choose_releases(
        [dict(CODER, release="deadbeef1234")], "aaaaaaaaaaaa", None, RELEASES, "stack1", host="ct200"
    )
    assert "coder" not in choices and len(problems) == 1
    assert problems[0].startswith(
        "ct200: service coder pins release 'deadbeef1234': no release on the host has that id or source revision"
    )
    assert "aaaaaaaaaaaa (revision %s, stack stack1)" % REVISION_A in problems[0]
    assert "cccccccccccc" not in problems[0]  # a base release is never a pin's target
    assert "roll out that revision first" in problems[0] and "set release: candidate" in problems[0]


def test_a_pin_never_names_a_base_release_nor_a_dirty_build_by_its_hash_alone():
    assert resolve_pin("cccccccccccc", RELEASES, "stack1") == (None, "cccccccccccc is a base release (no overlay)")
    dirty = {"dddddddddddd": {"source_revision": REVISION_A[:12] + "+dirty", "stack_id": "stack1"}}
    assert resolve_pin(REVISION_A[:7], dirty, "stack1")[0] is None
    assert resolve_pin(REVISION_A[:12] + "+dirty", dirty, "stack1") == ("dddddddddddd", None)
    assert resolve_pin("5e1f", RELEASES, "stack1")[0] is None  # too short to be a revision


def test_a_revision_built_for_two_stacks_prefers_the_active_one_and_asks_for_an_id_otherwise():
    two = {
        "aaaaaaaaaaaa": {"source_revision": REVISION_A, "stack_id": "old"},
        "eeeeeeeeeeee": {"source_revision": REVISION_A, "stack_id": "new"},
    }
    assert resolve_pin(REVISION_A, two, "new") == ("eeeeeeeeeeee", None)
    release_id, why = resolve_pin(REVISION_A, two, "other")
    assert (
        release_id is None
        and why.startswith("it matches 2 releases")
        and why.endswith("pin one of them by its release id")
    )


def test_a_pin_on_a_service_that_does_not_load_the_overlay_is_refused_before_anything_changes():
    chat = {
        "name": "chat",
        "model_path": "/m",
        "gpus": [0],
        "port": 30000,
        "speculative": {"algorithm": "NEXTN"},
        "release": "aaaaaaaaaaaa",
        "draft_model_path": "/d",
    }
    problems = service_problems([chat], [0], host="ct129")
    assert problems == [
        "ct129: sglang_services[0] (chat): release 'aaaaaaaaaaaa' is pinned, but NEXTN does not load the overlay "
        "(only DDTREE services run overlay releases); remove release"
    ]
    assert release_pin_problems("x", {"speculative": {"algorithm": "DDTREE"}, "release": "no spaces"})[0].startswith(
        "x: release 'no spaces' is neither 'candidate' nor a release id or source revision"
    )
    assert release_pin_problems("x", {"speculative": {"algorithm": "DDTREE"}}) == []


def test_the_overlays_plugin_is_told_apart_from_other_plugins():
    from ansible_collections.ddtree.sglang.plugins.module_utils.spec_matrix import overlay_plugins

    plugins = [
        {"name": "ddtree", "value": "sglang_overlay.adapter.plugin:load_plugin"},
        {"name": "vendor", "value": "vendor_plugin.hooks:load"},
        {"name": "lookalike", "value": "sglang_overlay_extra:load"},
    ]
    assert overlay_plugins(plugins) == ["ddtree"]
    assert overlay_plugins(plugins[1:]) == []
